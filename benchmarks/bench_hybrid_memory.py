"""Hybrid-worker memory: peak GPU memory of generation and of training, with and without offload,
and the seconds per step that offload costs.

The hybrid ``ActorRolloutRefWorker`` (one rank: the HF engine shares the actor's module) runs the
GRPO step of the side-by-side benchmark (``benchmarks/rlvr_side.py``: generate, reward, old
log-probs, update, weight sync) once per offload setting, each in a fresh worker:

| setting | ``actor.fsdp_config`` | between phases |
|---|---|---|
| ``none`` | both off | optimizer state on CPU during generation only (the hybrid worker always does that on GPU) |
| ``optimizer`` | ``optimizer_offload`` | optimizer state on CPU except during the update |
| ``param`` | ``param_offload`` | parameters on CPU except while a phase uses them |
| ``both`` | both on | both |

Per setting: the worker's peak ``torch.cuda.max_memory_allocated`` of each stage (``gen``,
``old_log_prob``, ``update_actor``: the worker resets the counter after each), the memory held
between steps, and the median step and stage seconds over the measured steps; then each setting's
extra seconds per step over ``none``. On CPU the run works but measures nothing useful (no CUDA
memory counters; the placement moves are no-ops there).

Usage::

    python -m benchmarks.bench_hybrid_memory --size smollm2-135m --json hybrid.json        # one GPU
    python -m benchmarks.bench_hybrid_memory --size tiny --prompts 2 --samples 2 --response-len 8   # CPU smoke run
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import statistics
import sys
import tempfile

import torch

from benchmarks.bench_grpo_vs_trl import save_random_model
from benchmarks.rlvr_side import RlvrSide
from benchmarks.workload import WORKLOADS, json_main

GIB = 1024**3
SETTINGS = {
    "none": (False, False),
    "optimizer": (False, True),
    "param": (True, False),
    "both": (True, True),
}
"""Offload setting -> (``param_offload``, ``optimizer_offload``)."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(WORKLOADS), default="tiny", help="workload preset")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu | cuda")
    parser.add_argument("--settings", default=",".join(SETTINGS), help=f"comma list of {', '.join(SETTINGS)}")
    parser.add_argument("--steps", type=int, default=2, help="measured steps per setting")
    parser.add_argument("--warmup", type=int, default=1, help="uncounted first steps per setting")
    parser.add_argument("--prompts", type=int, help="override the preset's prompts per step")
    parser.add_argument("--samples", type=int, help="override the preset's samples per prompt")
    parser.add_argument("--response-len", type=int, help="override the preset's response length")
    parser.add_argument("--fast-path", action="store_true", help="static KV cache + compiled decode (GPU)")
    parser.add_argument("--tokenizer", default="smollm2-135m-instruct", help="tokenizer (hub id, folder or name)")
    parser.add_argument("--seed", type=int, default=1, help="model init and sampling seed")
    parser.add_argument("--json", help="write the results to this file")
    return parser.parse_args(argv)


def _allocated(device: torch.device) -> int:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


def measure_setting(name: str, work, model_dir: str, tokenizer, device: torch.device, args) -> dict:
    """Run one offload setting in a fresh worker; its memory and timing summary."""
    param_offload, optimizer_offload = SETTINGS[name]
    overrides = [f"actor_rollout_ref.actor.fsdp_config.param_offload={str(param_offload).lower()}",
                 f"actor_rollout_ref.actor.fsdp_config.optimizer_offload={str(optimizer_offload).lower()}"]
    before = _allocated(device)
    side = RlvrSide(work, model_dir, tokenizer, device, args.seed, 1e-6, args.warmup + args.steps,
                    fast=args.fast_path and device.type == "cuda",
                    token_budget=40960 if device.type == "cuda" else None, overrides=overrides)
    after_init = _allocated(device)
    steps, resident = [], []
    for index in range(args.warmup + args.steps):
        steps.append(side.step(index))
        resident.append(_allocated(device))
        print(f"{name} step {index}: {steps[-1].seconds:.2f} s, stage peaks (GiB) "
              f"{ {k: round(v / GIB, 3) for k, v in steps[-1].stage_peak_bytes.items()} }, held after "
              f"{resident[-1] / GIB:.3f} GiB", flush=True)
    measured = steps[args.warmup:]
    summary = {
        "param_offload": param_offload, "optimizer_offload": optimizer_offload,
        "held_after_init_gib": (after_init - before) / GIB,
        "held_between_steps_gib": (max(resident[args.warmup:]) - before) / GIB,
        "stage_peak_gib": {k: max(s.stage_peak_bytes.get(k, 0) for s in measured) / GIB
                           for k in measured[0].stage_peak_bytes},
        "step_peak_gib": max(s.peak_bytes for s in measured) / GIB,
        "median_step_s": statistics.median(s.seconds for s in measured),
        "median_stage_s": {k: statistics.median(s.stages[k] for s in measured) for k in measured[0].stages},
        "step_s": [s.seconds for s in steps],
    }
    del side, steps, measured
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return summary


def run(args: argparse.Namespace) -> dict:
    from rlvr.utils.model import load_tokenizer

    device = torch.device(args.device)
    work = WORKLOADS[args.size]
    changes = {"prompts": args.prompts, "samples": args.samples, "response_len": args.response_len}
    work = dataclasses.replace(work, **{k: v for k, v in changes.items() if v is not None})
    names = [n.strip() for n in args.settings.split(",") if n.strip()]
    unknown = set(names) - set(SETTINGS)
    if unknown or not names:
        raise SystemExit(f"--settings takes {', '.join(SETTINGS)}, got {args.settings!r}")
    tokenizer = load_tokenizer(args.tokenizer)
    folder = tempfile.TemporaryDirectory(prefix="bench_hybrid_model_")
    save_random_model(work, tokenizer, folder.name, args.seed)
    results = {"workload": dataclasses.asdict(work), "device": str(device), "fast_path": args.fast_path,
               "settings": {}}
    for name in names:
        results["settings"][name] = measure_setting(name, work, folder.name, tokenizer, device, args)
    if "none" in results["settings"]:
        base = results["settings"]["none"]["median_step_s"]
        for summary in results["settings"].values():
            summary["offload_cost_s_per_step"] = summary["median_step_s"] - base
    print("\nsetting    gen peak  update peak  held between steps  s/step  offload cost")
    for name, s in results["settings"].items():
        peaks = s["stage_peak_gib"]
        print(f"{name:10s} {peaks.get('gen', float('nan')):8.3f}  {peaks.get('update_actor', float('nan')):11.3f}  "
              f"{s['held_between_steps_gib']:18.3f}  {s['median_step_s']:6.2f}  "
              f"{s.get('offload_cost_s_per_step', 0.0):+.2f}")
    folder.cleanup()
    return results


def main(argv: list[str] | None = None) -> int:
    return json_main(parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
