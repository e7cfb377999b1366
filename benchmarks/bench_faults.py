"""Fault-injection benchmark of automatic recovery (the figures of docs/RELIABILITY.md).

One fault-free reference run, then ``--runs`` runs of the same small GRPO job (a tiny random Llama,
addition prompts, 2 Ray worker processes on CPU, a checkpoint every ``--save-freq`` steps), each
with one fault drawn from a seeded plan:

- in a worker call (``rlvr.utils.fault_injection``): SIGKILL (what the OOM killer sends), a real
  segfault, or a hang past the call timeout, in generation, log-probs, the reference, the actor
  update or a checkpoint save, on either rank;
- from outside: SIGKILL of a random worker process at a random moment of the run.

For each run it reports whether the fault fired, whether the run finished all its steps, the
restarts, the steps redone, the time from the failure to ready workers, and whether every logged
metric (timings aside) equals the reference run's.

    python -m benchmarks.bench_faults --runs 8 --steps 8 --save-freq 2 --out runs/bench_faults.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

from benchmarks.workload import make_prompts
from rlvr.single_controller import init_ray
from rlvr.trainer.config import load_config
from rlvr.trainer.main_ppo import build_role_worker_mapping, run_ppo
from rlvr.trainer.tracking import read_metrics
from rlvr.utils.fault_injection import Fault, with_faults
from rlvr.utils.testing import save_tiny_model

REWARD_FILE = '''
from benchmarks.workload import score


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return score(solution_str, ground_truth)
'''
FAULT_METHODS = ("generate_sequences", "compute_log_prob", "compute_ref_log_prob", "update_actor", "save_checkpoint")
KINDS = ("kill", "kill", "segfault", "hang", "external")
UNTIMED = ("timing", "perf/", "trainer/restarts")


@dataclass
class Plan:
    """One run's fault: ``kind`` in ``kill | segfault | hang`` fires in ``method`` on ``rank`` at its
    ``call``-th call; ``external`` SIGKILLs a random worker ``delay_s`` after step ``after_step`` is
    logged (so the kill lands inside the run whatever the machine's speed)."""

    kind: str
    method: str = ""
    rank: int = 0
    call: int = 0
    after_step: int = 0
    delay_s: float = 0.0

    def describe(self) -> str:
        if self.kind == "external":
            return f"SIGKILL from outside, {self.delay_s:.1f} s after step {self.after_step}"
        return f"{self.kind} in {self.method}, rank {self.rank}, call {self.call}"


def plan_faults(runs: int, steps: int, save_freq: int, step_s: float, seed: int) -> list[Plan]:
    """A reproducible fault per run; calls fall inside the run (saves happen every ``save_freq``
    steps); an outside kill comes after a random step but the last, within 80% of ``step_s`` (the
    reference run's median step time after its first step)."""
    rng = random.Random(seed)
    plans = []
    for _ in range(runs):
        kind = rng.choice(KINDS)
        if kind == "external":
            plans.append(Plan(kind, after_step=rng.randint(1, steps - 1), delay_s=rng.uniform(0.0, 0.8) * step_s))
            continue
        method = rng.choice(FAULT_METHODS)
        calls = max(steps // save_freq - 1, 1) if method == "save_checkpoint" else steps
        plans.append(Plan(kind, method, rank=rng.randrange(2), call=rng.randint(1, calls)))
    return plans


def comparable(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Metric rows without wall-clock measurements and the restart counter."""
    return [{k: v for k, v in row.items() if not k.startswith(UNTIMED) and "memory" not in k} for row in rows]


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Totals over the fault runs: faults injected, runs completed, exact runs, steps redone, recovery times."""
    seconds = [s for r in results for s in r["recovery_s"]]
    return {
        "runs": len(results),
        "faults injected": sum(r["injected"] for r in results),
        "runs completed": sum(r["completed"] for r in results),
        "runs with the reference metrics": sum(r["exact"] for r in results),
        "restarts": sum(len(r["recovery_s"]) for r in results),
        "steps redone": sum(r["steps_redone"] for r in results),
        "recovery s (median)": round(statistics.median(seconds), 1) if seconds else None,
        "recovery s (max)": round(max(seconds), 1) if seconds else None,
    }


def _write_job(root: Path, prompts: int) -> tuple[Path, Path, Path]:
    """The tiny model, the addition prompts and the reward file of the job."""
    model = save_tiny_model(root / "model", hidden_size=64, intermediate_size=128)
    rows = [{"data_source": "addition", "prompt": p["messages"], "ability": "math",
             "reward_model": {"ground_truth": p["answer"]}, "extra_info": {"index": i}}
            for i, p in enumerate(make_prompts(prompts, seed=0))]
    data = root / "train.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    reward = root / "reward.py"
    reward.write_text(REWARD_FILE)
    return model, data, reward


def _overrides(model: Path, data: Path, reward: Path, run_dir: Path, args: argparse.Namespace) -> list[str]:
    values = {
        "actor_rollout_ref.model.path": model, "data.train_files": data, "data.max_prompt_length": 48,
        "data.max_response_length": 16, "data.train_batch_size": 4, "actor_rollout_ref.rollout.n": 4,
        "actor_rollout_ref.actor.ppo_mini_batch_size": 4, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 8,
        "actor_rollout_ref.actor.optim.lr": 1e-3, "custom_reward_function.path": reward,
        "reward_model.num_examine": 0, "trainer.backend": "ray", "trainer.device": "cpu",
        "trainer.n_gpus_per_node": 2, "trainer.num_threads": 1, "trainer.total_training_steps": args.steps,
        "trainer.save_freq": args.save_freq, "trainer.val_before_train": False, "trainer.report": False,
        "trainer.export_hf": False, "trainer.progress_bar": False, "trainer.default_local_dir": run_dir,
        "trainer.call_timeout_s": args.call_timeout_s, "trainer.max_restarts": 3, "trainer.resume_mode": "disable",
        "trainer.seed": args.seed,
    }
    return [f"{key}={value}" for key, value in values.items()]


def _logged_steps(metrics: Path) -> int:
    """How many step rows ``metrics`` holds so far (0 before the file exists)."""
    return len(metrics.read_text().splitlines()) if metrics.is_file() else 0


def _kill_a_worker_later(metrics: Path, plan: Plan, done: threading.Event, rng: random.Random,
                         killed: list[int]) -> threading.Thread:
    """A thread that waits until step ``plan.after_step`` is logged, then after ``plan.delay_s``
    SIGKILLs one rlvr worker process of this benchmark's own Ray cluster (descendants of this
    process; other users' workers are never touched). It gives up when ``done`` is set first."""

    def kill() -> None:
        while _logged_steps(metrics) < plan.after_step:
            if done.wait(0.05):
                return
        if done.wait(plan.delay_s):
            return
        workers = sorted(p.pid for p in psutil.Process().children(recursive=True)
                         if p.cmdline()[:1] and p.cmdline()[0].startswith("ray::FusedWorker"))
        if workers:
            victim = rng.choice(workers)
            os.kill(victim, signal.SIGKILL)
            killed.append(victim)

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread


def run_with_fault(plan: Plan, job: tuple[Path, Path, Path], run_dir: Path, args: argparse.Namespace,
                   reference: list[dict[str, Any]], rng: random.Random) -> dict[str, Any]:
    """One run with ``plan``'s fault; the row of the results table."""
    cfg = load_config("grpo", _overrides(*job, run_dir, args))
    mapping, _ = build_role_worker_mapping(cfg)
    marker = run_dir / "fault-fired"
    killed: list[int] = []
    killer, done = None, threading.Event()
    if plan.kind == "external":
        killer = _kill_a_worker_later(run_dir / "metrics.jsonl", plan, done, rng, killed)
    else:
        fault = Fault(plan.method, plan.rank, plan.call, plan.kind, str(marker))
        mapping = {role: with_faults(cls, [fault]) for role, cls in mapping.items()}
    start = time.monotonic()
    try:
        trainer = run_ppo(cfg, mapping)
        error, restarts, steps = None, trainer.recovery.restarts, trainer.global_steps
    except Exception as err:  # noqa: BLE001 - a failed run is a result of the benchmark
        error, restarts, steps = f"{type(err).__name__}: {str(err).splitlines()[0]}", [], 0
    done.set()
    if killer is not None:
        killer.join()  # a kill planned after the end of this run must not hit the next one
    rows = read_metrics(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").is_file() else []
    return {"fault": plan.describe(), "plan": asdict(plan), "injected": marker.exists() or bool(killed),
            "completed": error is None and steps == args.steps, "error": error,
            "exact": error is None and comparable(rows) == comparable(reference),
            "recovery_s": [round(r.seconds, 1) for r in restarts], "steps_redone": sum(r.steps_redone for r in restarts),
            "restored_steps": [r.restored_step for r in restarts], "wall_s": round(time.monotonic() - start, 1)}


def markdown(results: list[dict[str, Any]], summary: dict[str, Any]) -> str:
    lines = ["| run | fault | fired | completed | restarts (restored step) | steps redone | recovery (s) | "
             "metrics = reference |", "|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(results, start=1):
        restarts = f"{len(r['recovery_s'])} ({', '.join(str(s) for s in r['restored_steps'])})" if r["recovery_s"] else "0"
        lines.append(f"| {i} | {r['fault']} | {'yes' if r['injected'] else 'no'} | "
                     f"{'yes' if r['completed'] else 'no: ' + str(r['error'])} | {restarts} | "
                     f"{r['steps_redone']} | {', '.join(map(str, r['recovery_s'])) or '-'} | "
                     f"{'yes' if r['exact'] else 'no'} |")
    lines += ["", "| | |", "|---|---|", *[f"| {k} | {v} |" for k, v in summary.items()]]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8, help="runs with one fault each")
    parser.add_argument("--steps", type=int, default=8, help="training steps per run")
    parser.add_argument("--save-freq", type=int, default=2, help="checkpoint every N steps")
    parser.add_argument("--call-timeout-s", type=float, default=30.0, help="worker call timeout (hang detection)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the fault plan and of the runs")
    parser.add_argument("--out", type=Path, default=Path("runs/bench_faults.json"), help="JSON results")
    args = parser.parse_args()
    init_ray(num_cpus=2)
    with tempfile.TemporaryDirectory(prefix="rlvr-faults-") as tmp:
        root = Path(tmp)
        job = _write_job(root, prompts=64)
        start = time.monotonic()
        run_ppo(load_config("grpo", _overrides(*job, root / "reference", args)))
        reference_s = time.monotonic() - start
        reference = read_metrics(root / "reference" / "metrics.jsonl")
        step_s = statistics.median(row["timing_s/step"] for row in reference[1:])
        rng = random.Random(args.seed)
        results = []
        for i, plan in enumerate(plan_faults(args.runs, args.steps, args.save_freq, step_s, args.seed), 1):
            results.append(run_with_fault(plan, job, root / f"run{i}", args, reference, rng))
            print(f"run {i}: {results[-1]}", flush=True)
    summary = {"reference run s": round(reference_s, 1), **summarize(results)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "summary": summary,
                                    "runs": results}, indent=1))
    print(markdown(results, summary))


if __name__ == "__main__":
    main()
