"""Preference pairs from a policy's own samples, for the RM trainer (:mod:`rlvr.trainer.rm_trainer`).

A run config (default: the main job's preset) says which policy samples which prompts, how (the
rollout's temperature and ``n``), and how each sample is scored (its reward manager: for the main
job, reasoning-gym's checker of the last line). For every prompt, the policy's ``n`` samples are
split into right ones (``acc`` 1) and wrong ones, and the i-th distinct right answer is paired with
the i-th distinct wrong one. Each side is the response text exactly as the reward-model worker reads
it (:func:`rlvr.reward.reward_model.response_text`). Prompts are shuffled (``--seed``) and split
into training and held-out pairs by prompt, so no held-out prompt is trained on::

    python -m rlvr.data_prep.rm_pairs --out data/rm_pairs --prompts 512
    python -m rlvr.data_prep.rm_pairs --out data/rm_pairs --preset main_job actor_rollout_ref.rollout.n=16

Writes ``<out>/train.jsonl`` and ``<out>/test.jsonl`` (``prompt``, ``chosen``, ``rejected``,
``data_source``, ``prompt_index``) and ``<out>/summary.json`` (samples, sampled accuracy, pairs).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

PROMPT_KEYS = ["input_ids", "attention_mask", "position_ids"]


def pairs_of_group(rows: list[int], acc: Sequence[float], texts: Sequence[str]) -> list[tuple[int, int]]:
    """``(right row, wrong row)`` pairs of one prompt's samples: the i-th distinct right text with
    the i-th distinct wrong text (as many pairs as the smaller side has distinct texts)."""
    right, wrong, seen = [], [], set()
    for row in rows:
        if texts[row] in seen:
            continue
        seen.add(texts[row])
        (right if acc[row] >= 1.0 else wrong).append(row)
    return list(zip(right, wrong))


def sample_and_score(cfg: Any, prompts: int, batch_size: int) -> tuple[list[dict], dict[str, float]]:
    """Generate ``rollout.n`` samples for each of the first ``prompts`` training prompts (in the
    data order of ``cfg.data.seed``) with the rollout worker, score them with the run's reward
    manager, and return the pair rows (with ``prompt_index``) and the sampling summary."""
    from rlvr.protocol import DataProto
    from rlvr.reward.reward_model import response_text
    from rlvr.single_controller import ClassWithInitArgs, LocalResourcePool, LocalWorkerGroup
    from rlvr.trainer.data import collate_fn, create_rl_dataset
    from rlvr.trainer.ppo.metric_utils import sample_accuracy
    from rlvr.trainer.ppo.reward import compute_reward, load_reward_manager
    from rlvr.utils.tokenizer import hf_tokenizer
    from rlvr.workers.engine_workers import ActorRolloutRefWorker

    model = cfg.actor_rollout_ref.model
    tokenizer = hf_tokenizer(model.tokenizer_path or model.path)
    dataset = create_rl_dataset(cfg.data.train_files, cfg.data, tokenizer, None)
    order = np.random.default_rng(int(cfg.data.seed)).permutation(len(dataset))[:prompts]
    group = LocalWorkerGroup(LocalResourcePool(), ClassWithInitArgs(ActorRolloutRefWorker, cfg, "rollout"))
    group.init_model()
    reward_fn = load_reward_manager(cfg, tokenizer, num_examine=0)
    n, rows, accs = int(cfg.actor_rollout_ref.rollout.n), [], []
    for start in range(0, len(order), batch_size):
        index = order[start:start + batch_size]
        batch = DataProto.from_single_dict(collate_fn([dataset[int(i)] for i in index]))
        batch.non_tensor_batch["prompt_index"] = np.array([int(i) for i in index], dtype=object)
        batch = batch.repeat(n, interleave=True)
        gen_input = batch.pop(batch_keys=PROMPT_KEYS)
        gen_input.non_tensor_batch = dict(batch.non_tensor_batch)
        gen_input.meta_info = {"eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id,
                               "validate": False}
        output = group.generate_sequences(gen_input)
        batch = batch.union(output.select(batch_keys=list(output.batch.keys())))
        scores, extra = compute_reward(batch, reward_fn)
        acc = sample_accuracy(scores.sum(-1), extra).tolist()
        accs += acc
        texts = [response_text(batch, row, tokenizer) for row in range(len(batch))]
        for p in range(len(index)):
            for right, wrong in pairs_of_group(list(range(p * n, (p + 1) * n)), acc, texts):
                rows.append({"prompt": [dict(m) for m in batch.non_tensor_batch["raw_prompt"][right]],
                             "chosen": texts[right], "rejected": texts[wrong],
                             "data_source": str(batch.non_tensor_batch["data_source"][right]),
                             "prompt_index": int(batch.non_tensor_batch["prompt_index"][right])})
        print(f"rm_pairs: {start + len(index)}/{len(order)} prompts, {len(rows)} pairs, sampled accuracy "
              f"{np.mean(accs):.3f}", flush=True)
    group.shutdown()
    return rows, {"prompts": len(order), "samples": len(accs), "sampled_accuracy": float(np.mean(accs))}


def split_by_prompt(rows: list[dict], held_out: float, seed: int) -> tuple[list[dict], list[dict]]:
    """``(train, test)``: the pairs of a ``held_out`` share of the prompts (seeded) go to test."""
    prompts = sorted({row["prompt_index"] for row in rows})
    rng = np.random.default_rng(seed)
    test_prompts = set(rng.permutation(prompts)[: int(round(held_out * len(prompts)))].tolist())
    return ([r for r in rows if r["prompt_index"] not in test_prompts], [r for r in rows if r["prompt_index"] in test_prompts])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlvr.data_prep.rm_pairs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="output folder (train.jsonl, test.jsonl, summary.json)")
    parser.add_argument("--preset", default="main_job", help="run preset of the policy, its data and its reward")
    parser.add_argument("--prompts", type=int, default=512, help="training prompts to sample")
    parser.add_argument("--batch-size", type=int, default=32, help="prompts per generation call")
    parser.add_argument("--held-out", type=float, default=0.2, help="share of the prompts whose pairs are held out")
    parser.add_argument("overrides", nargs="*", help="run-config overrides, e.g. actor_rollout_ref.rollout.n=16")
    args = parser.parse_args(argv)
    from rlvr.trainer.config import load_config
    from rlvr.trainer.data import write_rows

    cfg = load_config(args.preset, ["trainer.backend=local", *args.overrides])
    rows, summary = sample_and_score(cfg, args.prompts, args.batch_size)
    train, test = split_by_prompt(rows, args.held_out, int(cfg.trainer.seed))
    out = Path(args.out)
    write_rows(train, out / "train.jsonl")
    write_rows(test, out / "test.jsonl")
    summary.update(train_pairs=len(train), test_pairs=len(test))
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
