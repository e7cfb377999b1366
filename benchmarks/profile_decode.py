"""Profile of the HF engine's decode loop (``HFRollout.generate_sequences``) on a benchmark workload.

The engine of ``benchmarks/bench_fp8_rollout.py`` (same model builder and rollout config: static KV
cache and compiled step with ``--compile``) generates the workload's batch (``prompts x samples``
rows, ``response_len`` tokens; random weights rarely emit EOS, so rows run to full length, but the
EOS check stays on unless ``--ignore-eos``). After one warm-up call (which compiles), one call is
timed without the profiler, then one runs under ``torch.profiler``. The JSON summary holds:

- ``decode_steps`` (decoder steps: one per token after the first), ``wall_s``, ``prefill_s``,
  ``ms_per_step`` (wall minus one prefill, per step) and the read floor of
  ``benchmarks/decode_floor.py`` with ``decode_over_floor``;
- ``launches_per_step``: on CUDA the device kernels per step and the host-side launches (kernel,
  graph, memcpy, memset API calls) per step; on CPU the aten ops per step;
- ``syncs``: host-device synchronisations, by event (stream/device/event synchronise, blocking
  copies, ``aten::item`` / ``aten::_local_scalar_dense`` / ``aten::is_nonzero``), ``read_backs``
  (``_local_scalar_dense`` + ``is_nonzero``: values read to the host), ``device_waits`` (the CUDA
  synchronise and blocking-copy calls), and ``total`` / ``per_step`` (waits on CUDA, read-backs on CPU);
- ``top_ops``: the 15 ops or kernels with the most self device time (self CPU time on CPU), with
  count and total milliseconds;
- ``split``: host and device milliseconds per step of the loop's parts, labelled only in the
  profiled call by wrapping the engine's functions (nothing is added to the engine itself):
  ``first_token`` (sampling of the prefill's logits), ``draw`` (the generator's uniform numbers),
  ``step`` (the decoder's ``sample_step``: the model step and the sampling, one CUDA graph when
  compiled), inside it ``model`` and ``sampling`` when not compiled, and ``stop_check`` (the
  ``done.all()`` read-back).

Usage::

    python -m benchmarks.profile_decode --size smollm2-135m --device cuda --compile --json decode_profile.json
    python -m benchmarks.profile_decode --size tiny --device cpu --no-compile --response-len 16 --json p.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from omegaconf import OmegaConf
from torch.profiler import ProfilerActivity, profile, record_function

from benchmarks.bench_fp8_rollout import build_model, engine_config
from benchmarks.decode_floor import floor_seconds, kv_bytes_per_token, prefill_seconds, weight_bytes
from benchmarks.rlvr_side import prompt_batches
from benchmarks.workload import WORKLOADS, json_main, sync
from rlvr.utils.model import load_tokenizer
from rlvr.workers.rollout import HFRollout, hf_rollout, static_decode

TOP = 15
SYNC_EVENTS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
               "aten::item", "aten::_local_scalar_dense", "aten::is_nonzero")
"""Profiler events that make the host wait for the device (``aten::item`` calls
``aten::_local_scalar_dense``, so a read-back can count twice: both are listed separately too)."""
HOST_LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch",
                 "cudaMemcpyAsync", "cudaMemsetAsync")
"""CUDA runtime/driver calls that put work on the device."""
SPLIT = ("first_token", "draw", "step", "model", "sampling", "stop_check")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(WORKLOADS), default="tiny", help="workload (architecture, batch)")
    parser.add_argument("--model", help="load this model (name, folder) instead of a random-init workload model")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu | cuda")
    parser.add_argument("--tokenizer", default="smollm2-135m-instruct", help="tokenizer of a random-init model")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                        help="static KV cache and compiled decode step (default: on for cuda, off for cpu)")
    parser.add_argument("--static-cache", action="store_true", help="static KV cache also without --compile")
    parser.add_argument("--prompts", type=int, help="override the workload's prompts")
    parser.add_argument("--samples", type=int, help="override the workload's samples per prompt")
    parser.add_argument("--response-len", type=int, help="override the workload's response length")
    parser.add_argument("--ignore-eos", action="store_true", help="no EOS check (the loop never reads back)")
    parser.add_argument("--hbm-bytes-per-s", type=float, default=3.0e12, help="memory bandwidth of the read floor")
    parser.add_argument("--seed", type=int, default=1, help="model init and sampling seed")
    parser.add_argument("--trace", help="also write a chrome trace of the profiled call here")
    parser.add_argument("--json", help="write the summary to this file")
    return parser.parse_args(argv)


def _labelled(label: str, fn: Callable) -> Callable:
    def wrapped(*args, **kwargs):
        with record_function(f"decode.{label}"):
            return fn(*args, **kwargs)
    return wrapped


@contextmanager
def labelled_loop(engine: HFRollout, compiled: bool) -> Iterator[None]:
    """Wrap the decode loop's parts in ``record_function`` ranges named ``decode.<part>`` (see
    :data:`SPLIT`) for as long as the block runs; the compiled function is never wrapped inside."""
    patches = [(hf_rollout, "sample_tokens"), (hf_rollout, "draw_uniform"), (engine.decoder, "sample_step"),
               (engine, "_all_stopped")]
    names = ["first_token", "draw", "step", "stop_check"]
    if not compiled:
        inner = "_forward_one" if isinstance(engine.decoder, static_decode.StaticCacheDecoder) else "step"
        patches += [(engine.decoder, inner), (static_decode, "sample_with_uniform")]
        names += ["model", "sampling"]
    saved = [(owner, attr, owner.__dict__.get(attr)) for owner, attr in patches]
    try:
        for (owner, attr), name in zip(patches, names, strict=True):
            setattr(owner, attr, _labelled(name, getattr(owner, attr)))
        yield
    finally:
        for owner, attr, value in saved:
            if value is None:  # an instance attribute shadowing its class's method: drop it
                delattr(owner, attr)
            else:
                setattr(owner, attr, value)


def count_steps(engine: HFRollout) -> list[int]:
    """Count the decoder's ``sample_step`` calls into the returned one-element list."""
    counter, inner = [0], engine.decoder.sample_step

    def counted(*args, **kwargs):
        counter[0] += 1
        return inner(*args, **kwargs)

    engine.decoder.sample_step = counted
    return counter


def _self_time_us(avg, on_device: bool) -> float:
    return avg.self_device_time_total if on_device else avg.self_cpu_time_total


def summarise(prof, steps: int, on_device: bool) -> dict:
    """Launches, syncs, top ops and the labelled split of one profiled generation (see the module
    docstring); times in milliseconds."""
    averages = prof.key_averages()
    by_name = {avg.key: avg for avg in averages}
    events = prof.events()
    kernels = sum(1 for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
    host_launches = sum(by_name[name].count for name in HOST_LAUNCHES if name in by_name)
    aten_ops = sum(avg.count for avg in averages if avg.key.startswith("aten::"))
    syncs = {name: by_name[name].count for name in SYNC_EVENTS if name in by_name}
    read_backs = syncs.get("aten::_local_scalar_dense", 0) + syncs.get("aten::is_nonzero", 0)
    waits = sum(count for name, count in syncs.items() if name.startswith("cuda"))
    ranked = sorted((avg for avg in averages if not avg.key.startswith("decode.") and _self_time_us(avg, on_device) > 0),
                    key=lambda avg: _self_time_us(avg, on_device), reverse=True)
    top = [{"name": avg.key, "count": avg.count, "total_ms": _self_time_us(avg, on_device) / 1e3} for avg in ranked[:TOP]]
    split = {}
    for part in SPLIT:
        avg = by_name.get(f"decode.{part}")
        if avg is not None:
            split[part] = {"calls": avg.count, "host_ms_per_step": avg.cpu_time_total / 1e3 / steps,
                           "device_ms_per_step": avg.device_time_total / 1e3 / steps}
    launches = {"aten_ops_per_step": aten_ops / steps}
    if on_device:
        launches |= {"device_kernels_per_step": kernels / steps, "host_launches_per_step": host_launches / steps}
    counted = waits if on_device else read_backs
    return {"launches_per_step": launches,
            "syncs": {"by_event": syncs, "read_backs": read_backs, "device_waits": waits, "total": counted,
                      "per_step": counted / steps},
            "top_ops": top, "top_ops_by": "self device time" if on_device else "self CPU time", "split": split}


def _write(results: dict, path: str | None) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(results, f, indent=1)


def run(args: argparse.Namespace) -> dict:
    """Build, warm up, time, profile; the timings are written to ``--json`` before the profiled call
    (and kept, with ``profile_error``, if profiling fails)."""
    device = torch.device(args.device)
    compiled = device.type == "cuda" if args.compile is None else args.compile
    changes = {"prompts": args.prompts, "samples": args.samples, "response_len": args.response_len}
    work = dataclasses.replace(WORKLOADS[args.size], **{k: v for k, v in changes.items() if v is not None})
    tokenizer = load_tokenizer(args.model or args.tokenizer)
    model = build_model(args, work, tokenizer, device, getattr(torch, work.dtype))
    prompts = prompt_batches(tokenizer, work, 1)[0].repeat(work.samples, interleave=True)
    prompt_len = int(prompts.batch["input_ids"].shape[1])
    config = OmegaConf.merge(engine_config(work, prompt_len, None, compiled),
                             {"ignore_eos": args.ignore_eos, "static_cache": compiled or args.static_cache})
    engine = HFRollout(config, model, tokenizer, device, seed=args.seed, owns_module=False)
    steps = count_steps(engine)
    start = time.perf_counter()
    engine.generate_sequences(prompts)  # warm-up (compiles; CUDA graphs are recorded here)
    warmup_s = time.perf_counter() - start
    steps[0] = 0
    sync(device)
    start = time.perf_counter()
    engine.generate_sequences(prompts)
    sync(device)
    wall = time.perf_counter() - start
    decode_steps = max(steps[0], 1)
    prefill = prefill_seconds(model, prompts.batch["input_ids"], prompts.batch["attention_mask"],
                              prompts.batch["position_ids"], device)
    floor = floor_seconds(weight_bytes(model), kv_bytes_per_token(model), work.sequences, prompt_len, decode_steps,
                          args.hbm_bytes_per_s)
    decode_s = max(wall - prefill, 0.0)
    results = {"workload": dataclasses.asdict(work), "device": str(device), "compile": compiled,
               "static_cache": bool(config.static_cache),
               "eos_check": not args.ignore_eos, "stop_check_every": hf_rollout.stop_check_interval(device, False),
               "rows": work.sequences, "prompt_len": prompt_len, "warmup_s": warmup_s, "decode_steps": steps[0],
               "wall_s": wall, "prefill_s": prefill, "decode_s": decode_s,
               "ms_per_step": decode_s / decode_steps * 1e3, "read_floor_s": floor,
               "bandwidth_bytes_per_s": args.hbm_bytes_per_s, "decode_over_floor": decode_s / floor}
    print(f"{work.name} on {device} ({'compiled' if compiled else 'eager'}), {work.sequences} rows: {steps[0]} "
          f"decode steps in {decode_s:.3f} s = {results['ms_per_step']:.2f} ms/step, read floor {floor * 1e3:.1f} ms, "
          f"{results['decode_over_floor']:.1f}x the floor (warm-up call {warmup_s:.1f} s)", flush=True)
    _write(results, args.json)
    try:
        results |= profiled(engine, prompts, device, compiled, decode_steps, args.trace)
    except Exception as exc:  # keep the timings: the profile is the second half of the answer
        results["profile_error"] = f"{type(exc).__name__}: {exc}"
        print(f"profiling failed: {results['profile_error']}", flush=True)
    return results


def profiled(engine: HFRollout, prompts, device: torch.device, compiled: bool, steps: int, trace: str | None) -> dict:
    """One generation under ``torch.profiler`` with the loop's parts labelled; its :func:`summarise`."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with labelled_loop(engine, compiled), profile(activities=activities) as prof:
        engine.generate_sequences(prompts)
        sync(device)
    if trace:
        prof.export_chrome_trace(trace)
    summary = summarise(prof, steps, device.type == "cuda")
    print(json.dumps({k: summary[k] for k in ("launches_per_step", "syncs", "split")}, indent=1), flush=True)
    print(f"top {TOP} by {summary['top_ops_by']}:")
    for op in summary["top_ops"]:
        print(f"  {op['total_ms']:9.2f} ms {op['count']:7d}x  {op['name'][:100]}", flush=True)
    return summary


def main(argv: list[str] | None = None) -> int:
    return json_main(parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
