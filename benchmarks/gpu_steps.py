"""Two small steps of ``benchmarks/gpu_checks.py`` that no other benchmark covers.

``make-model``: write the workload's random-init model (float32; the SmolLM2 architecture, or
Qwen2.5-1.5B's shape with ``--size qwen2.5-1.5b``: 6.2 GB in float32) and the tokenizer to a
folder, for the main-job steps (the real weights cannot travel to the GPU machine: SmolLM2's GGUF
file is 98 MB, the carried tree at most 64 MiB).

``logprobs``: the HF engine's sampled-token log-probs against the actor's recomputed ones
(``actor.use_rollout_log_probs=false``, so the actor always runs its own forward), with the model
in float32 and in bfloat16, through one GRPO step of the hybrid worker (``benchmarks/rlvr_side.py``).
In float32 the two must agree to rounding (the test threshold is 1e-3); in bfloat16 the gap is the
precision's own, reported for the rollout correction to act on.

Usage::

    python -m benchmarks.gpu_steps make-model --size smollm2-135m --out /tmp/model
    python -m benchmarks.gpu_steps make-model --size qwen2.5-1.5b --out /tmp/qwen
    python -m benchmarks.gpu_steps logprobs --size smollm2-135m --json logprobs.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile

import torch

from benchmarks.bench_grpo_vs_trl import save_random_model
from benchmarks.workload import WORKLOADS

FP32_GAP_LIMIT = 1e-3
"""Largest |rollout - actor| log-prob gap accepted in float32 (same weights, two kernel orders)."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("step", choices=("make-model", "logprobs"))
    parser.add_argument("--size", choices=sorted(WORKLOADS), default="tiny", help="workload preset")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu | cuda")
    parser.add_argument("--prompts", type=int, default=8, help="logprobs: prompts per step")
    parser.add_argument("--samples", type=int, default=8, help="logprobs: samples per prompt")
    parser.add_argument("--response-len", type=int, default=64, help="logprobs: response tokens")
    parser.add_argument("--fast-path", action="store_true", help="logprobs: static KV cache + compiled decode")
    parser.add_argument("--tokenizer", default="smollm2-135m-instruct", help="tokenizer (hub id, folder or name)")
    parser.add_argument("--seed", type=int, default=1, help="model init and sampling seed")
    parser.add_argument("--out", help="make-model: the folder to write")
    parser.add_argument("--json", help="logprobs: write the results to this file")
    return parser.parse_args(argv)


def logprob_gaps(args: argparse.Namespace, tokenizer) -> dict:
    """``{dtype: {max, mean, reused, within_limit}}`` of one hybrid-worker GRPO step per dtype."""
    from benchmarks.rlvr_side import RlvrSide

    device = torch.device(args.device)
    base = dataclasses.replace(WORKLOADS[args.size], prompts=args.prompts, samples=args.samples,
                               response_len=args.response_len)
    results = {"workload": dataclasses.asdict(base), "device": str(device), "fast_path": args.fast_path}
    with tempfile.TemporaryDirectory(prefix="gpu_steps_model_") as folder:
        save_random_model(base, tokenizer, folder, args.seed)
        for dtype in ("float32", "bfloat16"):
            work = dataclasses.replace(base, dtype=dtype)
            side = RlvrSide(work, folder, tokenizer, device, args.seed, 1e-6, 1,
                            fast=args.fast_path and device.type == "cuda", token_budget=None,
                            overrides=["actor_rollout_ref.actor.use_rollout_log_probs=false"])
            step = side.step(0)
            results[dtype] = {"max": step.log_prob_gap_max, "mean": step.log_prob_gap_mean,
                              "reused": step.reused_log_probs, "step_s": step.seconds}
            print(f"{dtype}: |rollout - actor| log-prob max {step.log_prob_gap_max:.3g}, mean "
                  f"{step.log_prob_gap_mean:.3g}", flush=True)
            del side
    results["float32"]["within_limit"] = results["float32"]["max"] < FP32_GAP_LIMIT
    return results


def main(argv: list[str] | None = None) -> int:
    from rlvr.utils.model import load_tokenizer

    args = parse_args(argv)
    tokenizer = load_tokenizer(args.tokenizer)
    if args.step == "make-model":
        if not args.out:
            raise SystemExit("make-model needs --out FOLDER")
        save_random_model(WORKLOADS[args.size], tokenizer, args.out, args.seed)
        print(f"wrote a random-init {args.size} model to {args.out}")
        return 0
    results = logprob_gaps(args, tokenizer)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0 if results["float32"]["within_limit"] else 1


if __name__ == "__main__":
    sys.exit(main())
