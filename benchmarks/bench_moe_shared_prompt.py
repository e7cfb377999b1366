"""Seconds per actor update of the MoE job, with and without the shared-prompt forward.

The MoE job's update (``--preset moe_job``: 4 prompts x ``rollout.n`` 8 responses, one mini-batch,
micro-batches of 16, AdamW, ``router_replay.mode=R3``) on its model (the upcycled Mixtral of
``python -m rlvr.data_prep.moe_model``, or with ``--random-layers N`` a random Mixtral of the same
widths and N layers), on ``--prompt-len``-token prompts and ``--response-len``-token responses. The
rows of a prompt carry that prompt's routes (as the HF engine records them), so R3 replays in both
runs; ``actor.share_prompt_forward`` is the only difference. Each setting runs a first update on a
fresh actor (reported as ``first``: it also allocates the gradients and AdamW's state, which on a
machine short of free memory took 1.5 minutes), then ``--repeats`` timed updates: wall seconds, and
the CPU seconds of this process (``_cpu``), which other jobs on a shared machine disturb less.

Usage::

    python -m benchmarks.bench_moe_shared_prompt --model runs/moe/model --repeats 2
    python -m benchmarks.bench_moe_shared_prompt --random-layers 4 --json shared.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
from transformers import MixtralConfig, MixtralForCausalLM

from rlvr.protocol import DataProto
from rlvr.trainer.config.loader import load_config
from rlvr.utils.model import load_causal_lm
from rlvr.workers.actor.dp_actor import DataParallelPPOActor
from rlvr.workers.moe.layout import ROUTED_EXPERTS
from rlvr.workers.optimizer import build_optimizer


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="runs/moe/model", help="the MoE job's model folder")
    parser.add_argument("--random-layers", type=int, default=0,
                        help="instead of --model: a random Mixtral of SmolLM2's widths (4 experts, top-2), this many layers")
    parser.add_argument("--prompt-len", type=int, default=90)
    parser.add_argument("--response-len", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", help="write the results here")
    return parser.parse_args(argv)


def _model(args: argparse.Namespace) -> torch.nn.Module:
    if not args.random_layers:
        return load_causal_lm(args.model)
    config = MixtralConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=args.random_layers,
                           num_attention_heads=9, num_key_value_heads=3, num_local_experts=4, num_experts_per_tok=2,
                           tie_word_embeddings=True, max_position_embeddings=2048, sliding_window=None)
    torch.manual_seed(0)
    return MixtralForCausalLM(config)


def _batch(prompts: int, n: int, prompt_len: int, response_len: int, layers: int, vocab: int) -> dict:
    """``prompts x n`` rows, grouped by prompt; full-length prompts and responses of ``response_len /
    2 .. response_len`` tokens; routes that agree within each prompt's rows."""
    gen = torch.Generator().manual_seed(0)
    rows, width = prompts * n, prompt_len + response_len
    prompt_ids = torch.randint(10, vocab, (prompts, prompt_len), generator=gen).repeat_interleave(n, dim=0)
    input_ids = torch.cat([prompt_ids, torch.randint(10, vocab, (rows, response_len), generator=gen)], dim=1)
    lengths = torch.randint(response_len // 2, response_len + 1, (rows,), generator=gen)
    mask = torch.ones(rows, width, dtype=torch.long)
    for row, length in enumerate(lengths.tolist()):
        mask[row, prompt_len + length :] = 0
    first = torch.randint(0, 4, (rows, width, layers), generator=gen)
    routes = torch.stack([first, (first + torch.randint(1, 4, first.shape, generator=gen)) % 4], dim=-1)
    routes[:, :prompt_len] = routes[::n, :prompt_len].repeat_interleave(n, dim=0)
    response_mask = mask[:, prompt_len:]
    return {"input_ids": input_ids * mask, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            "responses": (input_ids * mask)[:, prompt_len:], "response_mask": response_mask,
            "advantages": torch.randn(rows, response_len, generator=gen) * response_mask,
            "old_log_probs": -torch.rand(rows, response_len, generator=gen) * response_mask,
            ROUTED_EXPERTS: routes.masked_fill(~mask.bool()[..., None, None], -1).to(torch.int16)}


def _update_seconds(args: argparse.Namespace, share: bool) -> tuple[list[float], list[float], dict[str, float]]:
    """Wall and CPU seconds of each update (the first one first), and the first update's ``pg_loss``
    and fallback count (the same batch and weights in both settings: the losses must agree)."""
    cfg = load_config("moe_job", [f"actor_rollout_ref.actor.share_prompt_forward={share}"])
    actor_cfg = cfg.actor_rollout_ref.actor
    model = _model(args)
    model.train()
    n = int(cfg.actor_rollout_ref.rollout.n)
    rows = int(cfg.data.train_batch_size) * n
    actor = DataParallelPPOActor(actor_cfg, model, build_optimizer(model, actor_cfg.optim),
                                 mini_batch_size=int(actor_cfg.ppo_mini_batch_size) * n, log_prob_micro_batch_size=16,
                                 world_size=1, device="cpu", router_replay=str(actor_cfg.fsdp_config.router_replay.mode))
    assert actor.share_prompts is share
    batch = _batch(int(cfg.data.train_batch_size), n, args.prompt_len, args.response_len,
                   actor.routing.tap.shape.layers, model.config.vocab_size)
    assert len(batch["input_ids"]) == rows
    wall, cpu, first = [], [], {}
    for _ in range(1 + args.repeats):
        data = DataProto.from_dict(tensors=dict(batch), meta_info={"temperature": 1.0})
        began, began_cpu = time.perf_counter(), time.process_time()
        metrics = actor.update_policy(data)
        wall.append(round(time.perf_counter() - began, 2))
        cpu.append(round(time.process_time() - began_cpu, 2))
        print(f"share_prompt_forward={share}: {wall[-1]} s, {cpu[-1]} CPU s (pg_loss "
              f"{metrics['actor/pg_loss'][0]:.4f}, fallbacks {metrics['actor/moe_shared_prompt_fallback'][0]:.0f})",
              flush=True)
        first = first or {"pg_loss": float(metrics["actor/pg_loss"][0]),
                          "fallbacks": float(metrics["actor/moe_shared_prompt_fallback"][0])}
    return wall, cpu, first


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    cfg = load_config("moe_job")
    results = {"prompts": int(cfg.data.train_batch_size), "responses_per_prompt": int(cfg.actor_rollout_ref.rollout.n),
               "micro_batch": int(cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu), "prompt_len": args.prompt_len, "response_len": args.response_len,
               "model": f"random Mixtral, {args.random_layers} layers" if args.random_layers else args.model,
               "threads": args.threads}
    for share in (False, True):
        name = "shared" if share else "plain"
        wall, cpu, first = _update_seconds(args, share)
        results.update({f"{name}_first": wall[0], name: wall[1:], f"{name}_first_cpu": cpu[0], f"{name}_cpu": cpu[1:],
                        f"{name}_pg_loss": first["pg_loss"], f"{name}_fallbacks": first["fallbacks"]})
    for suffix in ("", "_cpu"):
        results[f"speedup{suffix}"] = round(statistics.median(results["plain" + suffix])
                                            / statistics.median(results["shared" + suffix]), 2)
    print(json.dumps(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main(sys.argv[1:])
