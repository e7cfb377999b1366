"""How much two compute processes slow each other down on this machine's cores.

The asynchronous schedules on a 2-core CPU give the rollout one core and the trainer the other; the
synchronous trainer runs each phase on both. Whether the overlap can win depends on two numbers
this script measures with the matrix products that dominate both phases (fp32, SmolLM2-135M's
shapes: hidden 576, MLP 1536):

- **two threads in one process** against one thread alone (what the synchronous trainer gets from
  the second core);
- **two one-thread processes at once**, each against one thread alone (what each side of an
  asynchronous run gets while the other side computes).

The overlap's ceiling is ``2 x concurrent / two_threads`` (both sides always busy); below 1 it
cannot beat the synchronous trainer at all. Run it on an idle machine::

    python -m benchmarks.core_contention [--seconds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time
from pathlib import Path

ROWS, HIDDEN, MLP = 512, 576, 1536
"""One micro-batch's tokens through one MLP projection of SmolLM2-135M."""


def gflops(threads: int, seconds: float) -> float:
    """GFLOP/s of repeated ``[ROWS, HIDDEN] @ [HIDDEN, MLP]`` products on ``threads`` threads."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(ROWS, HIDDEN), torch.randn(HIDDEN, MLP)
    for _ in range(20):  # warm-up
        a @ b
    done, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        for _ in range(20):
            a @ b
        done += 20
    return 2.0 * ROWS * HIDDEN * MLP * done / elapsed / 1e9


def _worker(threads: int, seconds: float, barrier, results) -> None:
    barrier.wait()
    results.put(gflops(threads, seconds))


def concurrent(processes: int, seconds: float) -> list[float]:
    """GFLOP/s of each of ``processes`` one-thread processes running at the same time."""
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(processes), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(1, seconds, barrier, results)) for _ in range(processes)]
    for proc in procs:
        proc.start()
    out = [results.get(timeout=seconds * 10 + 60) for _ in procs]
    for proc in procs:
        proc.join()
    return out


def measure(seconds: float) -> dict[str, float]:
    """One thread alone, two threads in one process, two one-thread processes at once (each run in
    a fresh process so that no thread pool is shared)."""
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        alone = pool.apply(gflops, (1, seconds))
    with ctx.Pool(1) as pool:
        two_threads = pool.apply(gflops, (2, seconds))
    pair = concurrent(2, seconds)
    return {
        "one_thread_gflops": alone,
        "two_threads_gflops": two_threads,
        "concurrent_gflops_each": pair,
        "two_threads_speedup": two_threads / alone,
        "concurrent_share": min(pair) / alone,
        "overlap_ceiling": sum(pair) / two_threads,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each measurement")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    result = measure(args.seconds)
    print(f"one thread alone: {result['one_thread_gflops']:.1f} GFLOP/s; two threads in one process: "
          f"{result['two_threads_gflops']:.1f} ({result['two_threads_speedup']:.2f}x)")
    print("two one-thread processes at once: " + ", ".join(f"{g:.1f}" for g in result["concurrent_gflops_each"])
          + f" GFLOP/s (each at {100 * result['concurrent_share']:.0f}% of a lone thread)")
    print(f"ceiling of the overlap against the synchronous trainer: {result['overlap_ceiling']:.2f}x")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
