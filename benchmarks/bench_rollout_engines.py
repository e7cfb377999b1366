"""Rollout engines side by side on the main job's rollout: time, weight sync and log-prob mismatch.

One rollout of the main job (``--prompts`` held-out addition prompts x ``--samples`` samples,
``--response-len`` new tokens, temperature 1.0) on the embedded SmolLM2-135M-Instruct with the HF
engine (fp32) and the vLLM engine (fp32 and bf16, in-process). For each vLLM engine: the seconds
to load the fp32 actor's weights in place, and the gap between its sampling log-probs and an fp32
transformers forward of the same tokens (the trainer's mismatch metrics,
:func:`~rlvr.trainer.ppo.rollout_correction.compute_rollout_mismatch_metrics`). Needs vLLM (run it
with ``.venv-vllm/bin/python``, see ``make setup-vllm``).

Usage::

    .venv-vllm/bin/python -m benchmarks.bench_rollout_engines --json runs/bench_rollout_engines.json
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from pathlib import Path

from omegaconf import OmegaConf

from rlvr.protocol import DataProto
from rlvr.trainer.config.schema import RolloutConfig
from rlvr.trainer.ppo.rollout_correction import compute_rollout_mismatch_metrics
from rlvr.utils.model import load_causal_lm, load_tokenizer
from rlvr.utils.testing import forward_log_probs
from rlvr.utils.torch_functional import compute_position_ids
from rlvr.workers.rollout import HFRollout, VLLMRollout

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct", help="model name or folder")
    parser.add_argument("--data", default="data/arith/test.jsonl", help="prompts in the common RL format")
    parser.add_argument("--prompts", type=int, default=8, help="distinct prompts per rollout")
    parser.add_argument("--samples", type=int, default=8, help="samples per prompt")
    parser.add_argument("--response-len", type=int, default=20, help="max new tokens")
    parser.add_argument("--repeats", type=int, default=3, help="timed rollouts per engine (after one warm-up)")
    parser.add_argument("--json", default=None, help="write the results here")
    return parser.parse_args(argv)


def main_job_prompts(tokenizer, path: str, count: int, samples: int) -> DataProto:
    rows = [json.loads(line) for line in Path(path).read_text().splitlines()[:count]]
    texts = [tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False) for row in rows]
    enc = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    mask = enc["attention_mask"]
    batch = DataProto.from_dict(tensors={"input_ids": enc["input_ids"], "attention_mask": mask,
                                         "position_ids": compute_position_ids(mask)})
    return batch.repeat(samples, interleave=True)


def time_rollouts(engine, batch: DataProto, repeats: int) -> tuple[list[float], DataProto]:
    engine.generate_sequences(batch)  # warm-up
    seconds, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = engine.generate_sequences(batch)
        seconds.append(time.perf_counter() - start)
    return seconds, out


def measure_vllm(model, tokenizer, batch: DataProto, cfg, dtype: str, repeats: int) -> dict:
    cfg = OmegaConf.merge(cfg, {"dtype": dtype})
    engine = VLLMRollout(cfg, model, tokenizer, "cpu", seed=1, owns_module=True)
    start = time.perf_counter()
    engine.update_weights(model.named_parameters(), 0)
    sync_s = time.perf_counter() - start
    seconds, out = time_rollouts(engine, batch, repeats)
    metrics = compute_rollout_mismatch_metrics(forward_log_probs(model, out.batch, 1.0), out.batch["rollout_log_probs"],
                                               out.batch["response_mask"], threshold=0.1)
    del engine
    gc.collect()
    return {"rollout_s": seconds, "rollout_median_s": statistics.median(seconds), "weight_sync_s": sync_s,
            "response_tokens": int(out.batch["response_mask"].sum()), "mismatch": metrics}


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    tokenizer = load_tokenizer(args.model)
    model = load_causal_lm(args.model).eval()
    batch = main_job_prompts(tokenizer, args.data, args.prompts, args.samples)
    cfg = OmegaConf.structured(RolloutConfig)
    cfg.response_length, cfg.prompt_length = args.response_len, int(batch.batch["input_ids"].shape[1])
    results: dict = {"sequences": len(batch), "response_len": args.response_len}
    seconds, out = time_rollouts(HFRollout(cfg, model, tokenizer, "cpu", seed=1, owns_module=False), batch,
                                 args.repeats)
    results["hf_fp32"] = {"rollout_s": seconds, "rollout_median_s": statistics.median(seconds),
                          "response_tokens": int(out.batch["response_mask"].sum())}
    for dtype, repeats in (("float32", args.repeats), ("bfloat16", 1)):
        results[f"vllm_{dtype}"] = measure_vllm(model, tokenizer, batch, cfg, dtype, repeats)
    print(json.dumps(results, indent=2))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
