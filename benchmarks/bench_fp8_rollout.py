"""FP8 rollout (``rollout.quantization=fp8``) against the unquantised HF engine: decode speed, the
log-prob mismatch it adds, and what the rollout correction makes of it.

Both engines generate the workload's batch (``prompts x samples`` rows, ``response_len`` tokens,
responses forced to full length) from the same model: the unquantised engine in the model's dtype,
the fp8 engine with its linear layers in e4m3 (``torch._scaled_mm`` on an H100; the exact float32
emulation elsewhere, which is slow: CPU speeds say nothing about the GPU). Reported:

- seconds per generation (median of ``--repeats`` after one warm-up call, which compiles with
  ``--compile``), tokens/s, and the weights-plus-KV-cache read floor of each engine;
- the fp8 engine's sampled-token log-probs against the actor's on the same tokens: a forward of
  the model in its own dtype (what the trainer's ``compute_log_prob`` computes) and in float32;
  the unquantised engine's gap to float32 beside it (the gap bf16 alone makes);
- ``algorithm.rollout_correction`` on the fp8 batch: the mismatch metrics, token-level truncated
  IS weights (threshold 2) and token-level rejection (band [1/2, 2]).

Usage::

    python -m benchmarks.bench_fp8_rollout --size smollm2-135m --compile --json fp8.json   # one GPU
    python -m benchmarks.bench_fp8_rollout --model smollm2-135m-instruct --device cpu --prompts 4 \\
        --response-len 32 --json fp8_cpu.json        # the real model's mismatch, CPU emulation
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time

import torch
from omegaconf import OmegaConf

from benchmarks.decode_floor import floor_seconds, kv_bytes_per_token, weight_bytes
from benchmarks.rlvr_side import prompt_batches
from benchmarks.workload import WORKLOADS, json_main, model_config, sync
from rlvr.trainer.config.schema import RolloutConfig
from rlvr.trainer.ppo.rollout_correction import (
    compute_rollout_correction_and_rejection_mask, compute_rollout_mismatch_metrics,
)
from rlvr.utils.model import load_causal_lm, load_tokenizer
from rlvr.workers.rollout import HFRollout


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(WORKLOADS), default="tiny", help="workload (architecture, batch)")
    parser.add_argument("--model", help="load this model (name, folder) instead of a random-init workload model")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu | cuda")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), help="model dtype (default: the workload's)")
    parser.add_argument("--tokenizer", default="smollm2-135m-instruct", help="tokenizer of a random-init model")
    parser.add_argument("--prompts", type=int, help="override the workload's prompts")
    parser.add_argument("--samples", type=int, help="override the workload's samples per prompt")
    parser.add_argument("--response-len", type=int, help="override the workload's response length")
    parser.add_argument("--compile", action="store_true",
                        help="static KV cache and compiled decode step (GPU fast path)")
    parser.add_argument("--repeats", type=int, default=2, help="timed generations per engine (after one warm-up)")
    parser.add_argument("--log-prob-rows", type=int, default=16, help="rows per forward of the log-prob reference")
    parser.add_argument("--hbm-bytes-per-s", type=float, default=3.0e12, help="memory bandwidth of the read floor")
    parser.add_argument("--seed", type=int, default=1, help="model init and sampling seed")
    parser.add_argument("--json", help="write the results to this file")
    return parser.parse_args(argv)


def build_model(args: argparse.Namespace, work, tokenizer, device: torch.device, dtype: torch.dtype):
    """The model both engines share: ``--model`` or the workload's architecture, random init."""
    if args.model:
        model = load_causal_lm(args.model, dtype=dtype, attn_implementation="sdpa")
    else:
        from transformers import AutoModelForCausalLM

        config = model_config(work, len(tokenizer), tokenizer.pad_token_id, tokenizer.bos_token_id,
                              tokenizer.eos_token_id)
        config._attn_implementation = "sdpa"
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(args.seed)
            model = AutoModelForCausalLM.from_config(config)
        model = model.to(dtype)
    return model.to(device).eval().requires_grad_(False)


def engine_config(work, prompt_len: int, quantization: str | None, compile_: bool):
    overrides = {"response_length": work.response_len, "prompt_length": prompt_len, "ignore_eos": True,
                 "temperature": 1.0, "micro_batch_size": work.sequences, "static_cache": compile_,
                 "compile": compile_, "free_cache_engine": False, "quantization": quantization}
    return OmegaConf.merge(OmegaConf.structured(RolloutConfig), overrides)


def time_generation(engine: HFRollout, prompts, device: torch.device, repeats: int) -> tuple[float, float, object]:
    """``(first call s, median of the timed calls s, last output)``."""
    times, out = [], None
    for _ in range(repeats + 1):
        sync(device)
        start = time.perf_counter()
        out = engine.generate_sequences(prompts)
        sync(device)
        times.append(time.perf_counter() - start)
    return times[0], statistics.median(times[1:]), out


@torch.no_grad()
def sequence_log_probs(model, batch, rows_per_forward: int) -> torch.Tensor:
    """Log-probs ``[b, R]`` (float32) of the response tokens under one plain forward of ``model``,
    ``rows_per_forward`` rows at a time (full-vocabulary logits of the whole batch would not fit)."""
    device = next(model.parameters()).device
    responses = batch["responses"]
    width = responses.shape[1]
    out = []
    for start in range(0, responses.shape[0], rows_per_forward):
        rows = slice(start, start + rows_per_forward)
        logits = model(input_ids=batch["input_ids"][rows].to(device),
                       attention_mask=batch["attention_mask"][rows].to(device),
                       position_ids=batch["position_ids"][rows].to(device)).logits[:, -width - 1 : -1].float()
        out.append(logits.log_softmax(-1).gather(-1, responses[rows, :, None].to(device)).squeeze(-1).cpu())
    return torch.cat(out)


def gap(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """max / mean ``|a - b|`` over the response tokens."""
    diff = (a - b).abs()[mask.bool()]
    return {"max": diff.max().item(), "mean": diff.mean().item()}


def run(args: argparse.Namespace) -> dict:
    device = torch.device(args.device)
    work = WORKLOADS[args.size]
    changes = {"prompts": args.prompts, "samples": args.samples, "response_len": args.response_len}
    work = dataclasses.replace(work, **{k: v for k, v in changes.items() if v is not None})
    dtype = getattr(torch, args.dtype or work.dtype)
    tokenizer = load_tokenizer(args.model or args.tokenizer)
    model = build_model(args, work, tokenizer, device, dtype)
    prompts = prompt_batches(tokenizer, work, 1)[0].repeat(work.samples, interleave=True)
    prompt_len = int(prompts.batch["input_ids"].shape[1])
    kv = kv_bytes_per_token(model)
    results: dict = {"workload": dataclasses.asdict(work), "model": args.model or f"random {work.name}",
                     "dtype": str(dtype), "device": str(device), "compile": args.compile, "engines": {}}
    outputs = {}
    for name, quantization in (("unquantized", None), ("fp8", "fp8")):
        engine = HFRollout(engine_config(work, prompt_len, quantization, args.compile), model, tokenizer, device,
                           seed=args.seed, owns_module=False)
        first, median, out = time_generation(engine, prompts, device, args.repeats)
        weights = weight_bytes(model) if engine.fp8 is None else \
            weight_bytes(engine.module) + engine.fp8.nbytes()  # parameters (head, norms) + e4m3 layers
        floor = floor_seconds(weights, kv, work.sequences, prompt_len, work.response_len, args.hbm_bytes_per_s)
        tokens = work.sequences * work.response_len
        results["engines"][name] = {
            "first_call_s": first, "median_s": median, "tokens_per_s": tokens / median, "weight_bytes": weights,
            "read_floor_s": floor, "over_floor": median / floor,
            "fp8_kernel": None if engine.fp8 is None else next(iter(engine.fp8.layers.values())).use_kernel}
        outputs[name] = out
        print(f"{name}: first call {first:.2f} s, median {median:.3f} s ({tokens / median:.0f} tok/s), "
              f"read floor {floor * 1e3:.1f} ms", flush=True)
        del engine
    results["fp8_speedup"] = results["engines"]["unquantized"]["median_s"] / results["engines"]["fp8"]["median_s"]

    fp8_out, plain_out = outputs["fp8"], outputs["unquantized"]
    mask = fp8_out.batch["response_mask"]
    fp8_lp = fp8_out.batch["rollout_log_probs"]
    actor_lp = sequence_log_probs(model, fp8_out.batch, args.log_prob_rows)
    fp32_model = model if dtype == torch.float32 else model.float()  # the last use of the model's own dtype
    fp32_lp = sequence_log_probs(fp32_model, fp8_out.batch, args.log_prob_rows)
    plain_fp32_lp = sequence_log_probs(fp32_model, plain_out.batch, args.log_prob_rows)
    results["log_prob_gap"] = {
        "fp8_vs_actor_same_dtype": gap(fp8_lp, actor_lp, mask),
        "fp8_vs_fp32": gap(fp8_lp, fp32_lp, mask),
        "unquantized_vs_fp32": gap(plain_out.batch["rollout_log_probs"], plain_fp32_lp,
                                   plain_out.batch["response_mask"]),
    }
    weights, kept, correction = compute_rollout_correction_and_rejection_mask(
        actor_lp, fp8_lp, mask, rollout_is="token", rollout_is_threshold=2.0, rollout_rs="token")
    results["correction"] = {**compute_rollout_mismatch_metrics(actor_lp, fp8_lp, mask, threshold=0.1), **correction,
                             "kept_token_fraction": (kept.sum() / mask.sum()).item()}
    print(json.dumps({k: results[k] for k in ("fp8_speedup", "log_prob_gap", "correction")}, indent=1), flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    return json_main(parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
