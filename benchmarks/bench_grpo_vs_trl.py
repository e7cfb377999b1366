"""GRPO step time: rlvr against TRL's ``GRPOTrainer``, side by side in one process.

Both frameworks start from the same random-init model (saved once to a temporary folder), get
the same prompts, reward and batch (``prompts x samples`` sequences, ``response_len`` tokens each,
never stopping early), no reference model (TRL ``beta=0``) and one optimizer step per batch.
Their steps alternate (TRL, rlvr, TRL, rlvr, ...) so that both see the same machine load; the
first ``--warmup`` steps of each are not counted (allocation, compilation).

Usage::

    python -m benchmarks.bench_grpo_vs_trl --size tiny --device cpu             # 2-core CPU
    python -m benchmarks.bench_grpo_vs_trl --size smollm2-135m --device cuda     # one GPU

Prints seconds per step of each framework and their ratio, rlvr's stage breakdown (generation,
reward, log-probs, update, weight sync), peak memory (``torch.cuda.max_memory_allocated`` on GPU,
sampled resident set size on CPU), the memory left after each rlvr step (growth check) and, on
GPU, the decode time against the weights-plus-KV-cache read floor. ``--json`` writes all of it.

The update's model FLOPs utilisation (:mod:`benchmarks.model_flops`): ``update_tflops`` and
``update_mfu`` of rlvr's update stage, and of TRL's update (its step less the generation part,
``_generate_and_score_completions``), against the GPU's dense bf16 peak (``--peak-tflops``
overrides it; on CPU the MFU is null unless it is given), in ``rlvr`` and ``trl`` of the results.

``--bypass`` runs rlvr with ``algorithm.rollout_correction.bypass_mode=true`` (no old-log-prob
forward); ``--bypass-steps N`` keeps the default and adds N rlvr steps in bypass mode after the
measured ones (same worker, already compiled), reported as ``rlvr_bypass``: both ways in one run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import sys
import tempfile

import psutil
import torch
from transformers import AutoModelForCausalLM

from benchmarks.decode_floor import decode_report
from benchmarks.model_flops import (
    decoder_params,
    flop_shape,
    peak_tflops,
    step_flops,
    utilisation,
)
from benchmarks.workload import (
    WORKLOADS,
    Workload,
    json_main,
    model_config,
    peak_rss_bytes,
)

GIB = 1024**3


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(WORKLOADS), default="tiny", help="workload preset")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu | cuda")
    parser.add_argument("--steps", type=int, default=3, help="measured steps per framework")
    parser.add_argument("--warmup", type=int, default=1, help="uncounted first steps per framework")
    parser.add_argument("--frameworks", default="rlvr,trl", help="comma list: rlvr, trl (default both)")
    parser.add_argument("--prompts", type=int, help="override the preset's prompts per step")
    parser.add_argument("--samples", type=int, help="override the preset's samples per prompt")
    parser.add_argument("--response-len", type=int, help="override the preset's response length")
    parser.add_argument("--tokenizer", default="smollm2-135m-instruct", help="tokenizer (hub id, folder or embedded name)")
    parser.add_argument("--seed", type=int, default=1, help="model init and sampling seed")
    parser.add_argument("--lr", type=float, default=1e-6, help="AdamW learning rate of both")
    parser.add_argument("--no-fast-path", action="store_true",
                        help="rlvr without the GPU fast path (no static cache / compile)")
    parser.add_argument("--trl-static-cache", action="store_true", help="TRL generate with cache_implementation=static")
    parser.add_argument("--trl-gradient-checkpointing", action="store_true",
                        help="TRL's default; off by default here (faster for these model sizes)")
    parser.add_argument("--token-budget", type=int,
                        help="rlvr: padded tokens per training micro-batch (default: whole batch on CPU; on GPU the "
                             "preset's rlvr_token_budget, else 40960)")
    parser.add_argument("--trl-micro-batch", type=int,
                        help="TRL: sequences per micro-batch, with gradient accumulation (default: the preset's)")
    parser.add_argument("--bypass", action="store_true",
                        help="rlvr: algorithm.rollout_correction.bypass_mode=true (rollout log-probs as the old ones)")
    parser.add_argument("--bypass-steps", type=int, default=0,
                        help="rlvr: this many extra steps in bypass mode after the measured ones (reported apart)")
    parser.add_argument("--peak-tflops", type=float,
                        help="dense bf16 peak of the device for the MFU (default: by GPU name; none on CPU)")
    parser.add_argument("--hbm-bytes-per-s", type=float, default=3.0e12, help="memory bandwidth of the decode floor")
    parser.add_argument("--override", action="append", default=[], help="extra rlvr config override (dotted)")
    parser.add_argument("--json", help="write the results to this file")
    return parser.parse_args(argv)


def workload_from(args: argparse.Namespace) -> Workload:
    work = WORKLOADS[args.size]
    changes = {"prompts": args.prompts, "samples": args.samples, "response_len": args.response_len,
               "trl_micro_batch": args.trl_micro_batch}
    work = dataclasses.replace(work, **{k: v for k, v in changes.items() if v is not None})
    if work.trl_micro_batch and work.sequences % work.trl_micro_batch:
        raise SystemExit(f"TRL micro-batch {work.trl_micro_batch} does not divide the {work.sequences} sequences "
                         "of a step; pass --trl-micro-batch with a divisor")
    return work


def save_random_model(work: Workload, tokenizer, folder: str, seed: int):
    """Write the workload's random-init model (float32) and the tokenizer to ``folder``; returns
    the model's config.

    A model vocabulary larger than the tokenizer (``qwen2``: 151936 rows, SmolLM2's tokenizer has
    49152 tokens) is kept as is, as in the real Qwen models: both sides sample over every row, and
    the ids the tokenizer lacks decode to nothing (the fast tokenizer skips them; TRL decodes with
    the same ``batch_decode``), so rewards see shorter texts. Padding the tokenizer up to the vocab
    would make them decode to invented strings and slow every prompt's tokenisation, and masking
    the logits would change the sampling work measured on both sides: both distort more.
    """
    config = model_config(work, len(tokenizer), tokenizer.pad_token_id, tokenizer.bos_token_id,
                          tokenizer.eos_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return config


def versions() -> dict[str, str]:
    import accelerate
    import transformers
    import trl

    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "trl": trl.__version__, "accelerate": accelerate.__version__}


def machine(device: torch.device) -> str:
    cores = len(psutil.Process().cpu_affinity())
    ram = psutil.virtual_memory().total / GIB
    base = f"{cores} CPU cores, {ram:.0f} GiB RAM"
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, {base}"
    return base


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def resident_bytes(device: torch.device) -> int:
    """Memory held now: allocated CUDA memory, or the process's resident set size."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device)
    return psutil.Process().memory_info().rss


def run(args: argparse.Namespace) -> dict:
    from rlvr.utils.model import load_tokenizer

    work = workload_from(args)
    device = torch.device(args.device)
    frameworks = {f.strip() for f in args.frameworks.split(",") if f.strip()}
    unknown = frameworks - {"rlvr", "trl"}
    if unknown or not frameworks:
        raise SystemExit(f"--frameworks takes rlvr and/or trl, got {args.frameworks!r}")
    total = args.warmup + args.steps
    tokenizer = load_tokenizer(args.tokenizer)
    folder = tempfile.TemporaryDirectory(prefix="bench_grpo_model_")
    config = save_random_model(work, tokenizer, folder.name, args.seed)
    print(f"workload {work}\ndevice {device} ({machine(device)}), torch threads {torch.get_num_threads()}", flush=True)

    rlvr_side = None
    if "rlvr" in frameworks:
        from benchmarks.rlvr_side import RlvrSide

        gpu_budget = work.rlvr_token_budget or 40960
        rlvr_side = RlvrSide(work, folder.name, tokenizer, device, args.seed, args.lr, total + args.bypass_steps,
                             fast=device.type == "cuda" and not args.no_fast_path,
                             token_budget=args.token_budget or (gpu_budget if device.type == "cuda" else None),
                             overrides=args.override, bypass=args.bypass)
    rlvr_steps, rlvr_resident, bypass_steps, trl_beyond = [], [], [], None

    def rlvr_step(index: int, bypass: bool | None = None) -> None:
        if rlvr_side is None:
            return
        rec = rlvr_side.step(index, bypass)
        (bypass_steps if bypass else rlvr_steps).append(rec)
        rlvr_resident.append(resident_bytes(device))
        stages = " ".join(f"{k}={v:.2f}" for k, v in rec.stages.items())
        print(f"rlvr step {index}: {rec.seconds:.2f} s ({rec.cpu_seconds:.2f} CPU s; {stages}) peak "
              f"{rec.peak_bytes / GIB:.2f} GiB (+{rec.rise_bytes / GIB:.2f}) reused_log_probs={rec.reused_log_probs}"
              f" bypass={rec.bypass}", flush=True)

    trl_steps = []
    if "trl" in frameworks:
        from benchmarks.trl_side import TrlSide

        trl_side = TrlSide(work, folder.name, tokenizer, device, args.seed, args.lr,
                           gradient_checkpointing=args.trl_gradient_checkpointing,
                           static_cache=args.trl_static_cache)

        def between(index: int, rec) -> None:
            print(f"trl  step {index}: {rec.seconds:.2f} s ({rec.cpu_seconds:.2f} CPU s; generation "
                  f"{rec.generation_seconds:.2f}, update {rec.update_seconds:.2f}) peak "
                  f"{rec.peak_bytes / GIB:.2f} GiB (+{rec.rise_bytes / GIB:.2f})", flush=True)
            rlvr_step(index)

        trl_steps = trl_side.run(total, between)
        trl_beyond = trl_side.reward.beyond / max(trl_side.reward.tokens, 1)
    else:
        for index in range(total):
            rlvr_step(index)
    for index in range(total, total + (args.bypass_steps if rlvr_side is not None else 0)):
        rlvr_step(index, bypass=True)

    flops = batch_flops(config, tokenizer, work, total)
    results = summarise(args, work, device, rlvr_steps, rlvr_resident, trl_steps)
    utilisation_of = update_utilisation(args, config, device, flops, rlvr_steps, trl_steps)
    results.update(peak_tflops=utilisation_of.pop("peak_tflops"), params=utilisation_of.pop("params"))
    for side, fields in utilisation_of.items():
        results[side].update(fields)
    if bypass_steps:
        results["rlvr_bypass"] = _bypass_summary(bypass_steps)
    if "trl" in results:
        results["trl"]["sampled_beyond_tokenizer"] = trl_beyond
    shares = {k: results[k]["sampled_beyond_tokenizer"] for k in ("rlvr", "trl") if k in results}
    print(f"sampled response ids the tokenizer ({len(tokenizer)} tokens) lacks: {shares}", flush=True)
    if rlvr_side is not None and device.type == "cuda":
        results["decode"] = decode_report(rlvr_side, work, args.hbm_bytes_per_s,
                                          _median([s.stages["generation"] for s in rlvr_steps[args.warmup:]]))
        print(json.dumps(results["decode"], indent=1), flush=True)
    folder.cleanup()
    return results


def batch_flops(config, tokenizer, work: Workload, total: int) -> list[float]:
    """Model FLOPs of the update of each step's batch (:func:`~benchmarks.model_flops.step_flops`),
    from the prompts' real lengths plus ``response_len`` per sequence: both sides generate full-length
    responses (rlvr ``ignore_eos``, TRL ``min_new_tokens``)."""
    from benchmarks.rlvr_side import prompt_batches

    shape = flop_shape(config)
    out = []
    for batch in prompt_batches(tokenizer, work, total):
        lengths = [int(n) + work.response_len for n in batch.batch["attention_mask"].sum(-1).tolist()]
        out.append(step_flops(shape, lengths * work.samples, work.sequences * work.response_len))
    return out


def update_utilisation(args, config, device: torch.device, flops: list[float], rlvr_steps: list,
                       trl_steps: list) -> dict:
    """``{side: {update_flops, median_update_s, update_tflops, update_mfu}}`` (the median FLOPs of
    the measured steps' batches over their median update seconds), the peak they are taken against
    (``peak_tflops``) and the model's ``params``."""
    peak = peak_tflops(device, args.peak_tflops)
    out: dict = {"peak_tflops": peak, "params": sum(decoder_params(config))}
    sides = {"rlvr": [(s.stages["update"], flops[i]) for i, s in enumerate(rlvr_steps)],
             "trl": [(s.update_seconds, flops[i]) for i, s in enumerate(trl_steps)]}
    for name, pairs in sides.items():
        measured = pairs[args.warmup:]
        if not measured:
            continue
        flops_median, seconds = _median([f for _, f in measured]), _median([sec for sec, _ in measured])
        rate = utilisation(flops_median, seconds, peak)
        side = {"update_flops": flops_median, "median_update_s": seconds, "update_tflops": rate["tflops"],
                "update_mfu": rate["mfu"]}
        if name == "trl":
            side["update_time"] = "step less _generate_and_score_completions (generation, reward, advantages)"
        out[name] = side
        mfu = f"{side['update_mfu']:.1%}" if peak else f"n/a (no peak known for {device}; pass --peak-tflops)"
        print(f"{name} update: {side['update_flops'] / 1e12:.3g} TFLOP in {side['median_update_s']:.2f} s = "
              f"{side['update_tflops']:.3g} TFLOPS, MFU {mfu}", flush=True)
    return out


def _bypass_summary(steps: list) -> dict:
    """Medians of the extra rlvr steps in bypass mode (no warm-up: the worker is warm)."""
    stages = {k: _median([s.stages[k] for s in steps]) for k in steps[0].stages}
    print("rlvr bypass stages: " + ", ".join(f"{k} {v:.2f} s" for k, v in stages.items()), flush=True)
    return {"step_s": [s.seconds for s in steps], "median_s": _median([s.seconds for s in steps]),
            "stages_median_s": stages, "reused_rollout_log_probs": all(s.reused_log_probs for s in steps),
            "bypass": True, "peak_gib": max(s.peak_bytes for s in steps) / GIB,
            "stage_peak_gib": {k: max(s.stage_peak_bytes.get(k, 0) for s in steps) / GIB
                               for k in steps[0].stage_peak_bytes}}


def _side_summary(steps: list, warmup: int) -> dict:
    """Per-step lists and medians of one framework (the first ``warmup`` steps not counted)."""
    measured = steps[warmup:]
    return {"step_s": [s.seconds for s in steps], "cpu_s": [s.cpu_seconds for s in steps],
            "median_s": _median([s.seconds for s in measured]),
            "median_cpu_s": _median([s.cpu_seconds for s in measured]),
            "peak_gib": max(s.peak_bytes for s in measured) / GIB,
            "rise_gib": max(s.rise_bytes for s in measured) / GIB}


def summarise(args, work: Workload, device: torch.device, rlvr_steps: list, rlvr_resident: list[int],
              trl_steps: list) -> dict:
    """Medians over the measured steps, the ratios, and the printed summary.

    Three ratios rlvr/TRL: of the median wall times, the median of the step-by-step ratios (each
    TRL step against the rlvr step right after it: robust to a machine whose load drifts), and of
    the median process CPU times (the work done, whatever else runs on the machine).
    """
    out: dict = {"workload": dataclasses.asdict(work), "device": str(device), "machine": machine(device),
                 "versions": versions(), "warmup": args.warmup, "steps": args.steps}
    print(f"\n== {work.name}: {work.prompts} prompts x {work.samples} samples x {work.response_len} tokens on "
          f"{out['machine']}")
    for name, steps in (("rlvr", rlvr_steps), ("trl", trl_steps)):
        if len(steps) > args.warmup:
            out[name] = side = _side_summary(steps, args.warmup)
            print(f"{name:4s}: {side['median_s']:.2f} s/step, {side['median_cpu_s']:.2f} CPU s/step (median of "
                  f"{len(steps) - args.warmup}); peak memory {side['peak_gib']:.2f} GiB, rise within a step "
                  f"{side['rise_gib']:.2f} GiB")
    if "rlvr" in out:
        measured = rlvr_steps[args.warmup:]
        stages = {k: _median([s.stages[k] for s in measured]) for k in measured[0].stages}
        out["rlvr"].update(stages_median_s=stages, resident_after_step_gib=[r / GIB for r in rlvr_resident],
                           reused_rollout_log_probs=all(s.reused_log_probs for s in measured),
                           bypass=all(s.bypass for s in measured),
                           sampled_beyond_tokenizer=sum(s.beyond_tokenizer for s in rlvr_steps)
                           / max(sum(s.response_tokens for s in rlvr_steps), 1),
                           stage_peak_gib={k: max(s.stage_peak_bytes.get(k, 0) for s in measured) / GIB
                                           for k in measured[0].stage_peak_bytes},
                           rollout_log_prob_gap_max=max(s.log_prob_gap_max for s in measured),
                           rollout_log_prob_gap_mean=_median([s.log_prob_gap_mean for s in measured]))
        print("rlvr stages: " + ", ".join(f"{k} {v:.2f} s" for k, v in stages.items()))
        print("rlvr memory after each step (GiB): " + " ".join(f"{r:.2f}" for r in out["rlvr"]["resident_after_step_gib"]))
        print(f"rlvr rollout/actor log-prob gap: max {out['rlvr']['rollout_log_prob_gap_max']:.3g}, mean "
              f"{out['rlvr']['rollout_log_prob_gap_mean']:.3g}; stage peaks (GiB) {out['rlvr']['stage_peak_gib']}")
    if "trl" in out:
        out["trl"].update(generation_s=[s.generation_seconds for s in trl_steps],
                          update_s=[s.update_seconds for s in trl_steps])
    if "rlvr" in out and "trl" in out:
        pairs = [r.seconds / t.seconds for r, t in zip(rlvr_steps[args.warmup:], trl_steps[args.warmup:])]
        out["ratio_rlvr_over_trl"] = out["rlvr"]["median_s"] / out["trl"]["median_s"]
        out["ratio_pairwise_median"] = _median(pairs)
        out["ratio_cpu"] = out["rlvr"]["median_cpu_s"] / out["trl"]["median_cpu_s"]
        print(f"ratio rlvr/TRL: {out['ratio_rlvr_over_trl']:.3f} (medians), {out['ratio_pairwise_median']:.3f} "
              f"(step by step), {out['ratio_cpu']:.3f} (CPU time); TRL/rlvr = {1 / out['ratio_rlvr_over_trl']:.2f}x")
    out["process_peak_rss_gib"] = peak_rss_bytes() / GIB
    print(f"process peak RSS {out['process_peak_rss_gib']:.2f} GiB; versions {out['versions']}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    return json_main(parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
