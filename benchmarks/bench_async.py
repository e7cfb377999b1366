"""Synchronous against asynchronous training, side by side in one run (the figures of
docs/PERFORMANCE.md, "Asynchronous training").

The main job (GRPO on the embedded SmolLM2-135M-Instruct, two-number addition; ``--preset main_job``)
runs in each schedule, one after the other on the same machine, for every seed:

- ``sync``: the colocated trainer (the default), generation and training each on both cores;
- ``one_step``: the rollout in a child process (``actor_rollout_ref.hybrid_engine=false``), batch k+1
  generated on one core while batch k trains on the other;
- ``bounded``: the same placement, the rollout streaming ahead within ``max_staleness=2`` versions,
  with partial rollouts;

then the tool-use job (``--preset tool_job``, long multi-turn generations) in the three schedules,
the staleness-4 ablation (bounded, ``max_staleness=4``, with and without the decoupled-PPO
correction, on the first ``--ablation-seeds`` seeds) and a one-thread calibration of the synchronous trainer, from which
:mod:`benchmarks.async_simulator` predicts the asynchronous speedups before they are compared with
the measured ones; with ``--lend`` also ``one_step_lend`` and ``bounded_lend`` (with
``async_training.lend_idle_cores=true``) on both jobs, and with ``--lend-only`` just those beside
``sync`` (and the calibration, from which the simulator estimates what lending can gain, batch by batch).
Every run is a fresh ``rlvr`` command in its own process.

Reported per schedule: steps per hour (training steps over the summed step times; validation is
the same work in every schedule and is left out), the speedup over ``sync``, held-out greedy
accuracy every ``--test-freq`` steps (mean over the seeds) and, at equal wall-clock, the accuracy
``sync`` had when the asynchronous run finished (interpolated between its validations), the median
stage times, the staleness and the idle time of trainer and rollout. The load average of the machine
is recorded before and after every run: compare runs only on an idle machine.

    python -m benchmarks.bench_async                                  # everything (hours on 2 cores)
    python -m benchmarks.bench_async --lend-only --tool-steps 0       # sync against the lent schedules
    python -m benchmarks.bench_async --steps 4 --seeds 1 --test-freq 2 --tool-steps 0 --no-ablation \
        --override data.val_max_samples=16                           # a quick check
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.async_simulator import corun_factor, overlap_ceiling, predict_from_stages, predict_lent_run, thread_factors

APART = ["actor_rollout_ref.hybrid_engine=false"]
SCHEDULES = {
    "sync": [],
    "one_step": [*APART, "async_training.mode=one_step"],
    "bounded": [*APART, "async_training.mode=bounded", "async_training.max_staleness=2",
                "async_training.partial_rollout=true"],
}
LENDING = {"one_step_lend": [*SCHEDULES["one_step"], "async_training.lend_idle_cores=true"],
           "bounded_lend": [*SCHEDULES["bounded"], "async_training.lend_idle_cores=true"]}
"""``--lend``: ``one_step`` and ``bounded`` with the idle cores lent between the trainer and the rollout."""
ABLATION = {
    "bounded_s4_corrected": [*APART, "async_training.mode=bounded", "async_training.max_staleness=4"],
    "bounded_s4_uncorrected": [*APART, "async_training.mode=bounded", "async_training.max_staleness=4",
                               "async_training.compute_prox_log_prob=false"],
}


EXTRA: list[str] = []
"""Overrides given with ``--override``, added to every run (e.g. a smaller validation set for a quick check)."""


def finished_run(run_dir: Path, steps: int) -> dict | None:
    """A run of an earlier, interrupted benchmark that completed all ``steps`` (``run.json`` is written
    only after its command succeeded), or None."""
    record = run_dir / "run.json"
    if not record.is_file():
        return None
    run = json.loads(record.read_text())
    return run if sum("timing_s/step" in row for row in run["rows"]) == steps else None


def run_job(preset: str, name: str, overrides: list[str], out: Path, steps: int, seed: int, test_freq: int) -> dict:
    """One ``rlvr`` command; returns its metrics rows, wall time and the load averages around it (its
    checkpoints are deleted once the run is recorded). A run that an earlier benchmark in ``out``
    finished (same name and steps) is read back, not run again, so an interrupted measurement goes on
    where it stopped (delete its folder to measure it again)."""
    run_dir = out / name
    earlier = finished_run(run_dir, steps)
    if earlier is not None:
        print(f"{name}: read back from {run_dir / 'run.json'} (finished earlier)", flush=True)
        return earlier
    shutil.rmtree(run_dir, ignore_errors=True)  # an unfinished earlier attempt: start it again from scratch
    args = [sys.executable, "-m", "rlvr.trainer.main_ppo", "--preset", preset, *overrides, *EXTRA,
            f"trainer.total_training_steps={steps}", "trainer.max_time_s=null", f"trainer.test_freq={test_freq}",
            f"trainer.seed={seed}", f"trainer.default_local_dir={run_dir}", "trainer.resume_mode=disable",
            "trainer.progress_bar=false", "trainer.export_hf=false", "trainer.report=false"]
    load_before = os.getloadavg()
    start = time.monotonic()
    done = subprocess.run(args, capture_output=True, text=True)
    wall = time.monotonic() - start
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    run = {"name": name, "rows": rows, "wall_s": wall, "load_before": load_before, "load_after": os.getloadavg()}
    (run_dir / "run.json").write_text(json.dumps(run))
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)  # 1.6 GB a run: the benchmark would fill a disk
    return run


def summarize(run: dict) -> dict[str, Any]:
    """Steps per hour, validation accuracy by step and by training time, median stage times."""
    steps = [r for r in run["rows"] if "timing_s/step" in r]
    elapsed, accuracy = 0.0, {}
    clock = {0: 0.0}
    for row in run["rows"]:
        if "timing_s/step" in row:
            elapsed += row["timing_s/step"]
            clock[row["step"]] = elapsed
        if "val/acc" in row:
            accuracy[row["step"]] = row["val/acc"]
    train_s = sum(r["timing_s/step"] for r in steps)

    def median(key: str) -> float | None:
        values = [r[key] for r in steps if key in r]
        return statistics.median(values) if values else None

    keys = ("timing_s/step", "timing_s/gen", "timing_s/old_log_prob", "timing_s/update_actor", "timing_s/update_weights",
            "async/rollout_gen_s",
            "async/trainer_wait_s", "async/rollout_wait_s", "async/staleness_mean", "async/staleness_max",
            "async/weight_push_s", "async/interrupted_generations", "response_length/mean")
    return {"steps": len(steps), "train_s": train_s, "steps_per_hour": 3600.0 * len(steps) / train_s,
            "gen_and_step_s": [[r.get("timing_s/gen", 0.0), r["timing_s/step"]] for r in steps],
            # an asynchronous run's own generations: seconds, and the share of their decode steps on lent cores
            "rollout_gen_s": [[r.get("async/rollout_gen_s"), r.get("async/rollout_lent_core_share")] for r in steps],
            "accuracy": accuracy, "accuracy_clock": {step: clock.get(step) for step in accuracy},
            "medians": {key: median(key) for key in keys}, "wall_s": run["wall_s"],
            "load": [run["load_before"], run["load_after"]]}


def accuracy_at(summary: dict, seconds: float) -> float:
    """Held-out accuracy at ``seconds`` of training time, interpolated between validations."""
    points = sorted((summary["accuracy_clock"][s], summary["accuracy"][s]) for s in summary["accuracy"])
    for (t0, a0), (t1, a1) in zip(points, points[1:]):
        if t0 <= seconds <= t1:
            return a0 + (a1 - a0) * (seconds - t0) / max(t1 - t0, 1e-9)
    return points[-1][1]


def compare(summaries: dict[str, list[dict]]) -> dict[str, dict]:
    """Per schedule, over its seeds: steps/hour (mean, min, max), speedup over sync, accuracy by
    step, the difference at the last step, and sync's accuracy at the same training time."""
    sync = summaries["sync"]
    table = {}
    for mode, runs in summaries.items():
        rate = [r["steps_per_hour"] for r in runs]
        steps = sorted(set.intersection(*(set(r["accuracy"]) for r in runs)))
        by_step = {s: statistics.mean(r["accuracy"][s] for r in runs) for s in steps}
        at_sync_clock = [accuracy_at(s, r["train_s"]) for s, r in zip(sync, runs)]
        table[mode] = {"steps_per_hour": statistics.mean(rate), "steps_per_hour_range": [min(rate), max(rate)],
                       "speedup": statistics.mean(rate) / statistics.mean(x["steps_per_hour"] for x in sync),
                       "accuracy_by_step": by_step,
                       "sync_accuracy_at_equal_time": statistics.mean(at_sync_clock)}
    last = max(table["sync"]["accuracy_by_step"])
    for row in table.values():
        row["accuracy_delta_at_last_step"] = row["accuracy_by_step"][last] - table["sync"]["accuracy_by_step"][last]
    return table


def markdown(job: str, table: dict[str, dict], summaries: dict[str, list[dict]]) -> str:
    steps = sorted(table["sync"]["accuracy_by_step"])
    lines = [f"### {job}", "", "| schedule | steps/hour (range) | x sync | held-out accuracy at steps "
             f"{', '.join(map(str, steps))} | delta at {steps[-1]} | sync at equal time | median step / gen wait | "
             "staleness mean | load avg |", "|---|---|---|---|---|---|---|---|---|"]
    for mode, row in table.items():
        runs = summaries[mode]
        med = {key: statistics.median(r["medians"][key] or 0.0 for r in runs)  # median over the seeds
               for key in ("timing_s/step", "timing_s/gen", "async/staleness_mean")}
        loads = [load[0] for r in runs for load in r["load"]]
        accuracy = ", ".join(f"{100 * row['accuracy_by_step'][s]:.0f}" for s in steps)
        lines.append(
            f"| {mode} | {row['steps_per_hour']:.0f} ({row['steps_per_hour_range'][0]:.0f}-"
            f"{row['steps_per_hour_range'][1]:.0f}) | {row['speedup']:.2f} | "
            f"{accuracy} | "
            f"{100 * row['accuracy_delta_at_last_step']:+.0f} | {100 * row['sync_accuracy_at_equal_time']:.0f} | "
            f"{med['timing_s/step']:.1f} / {med['timing_s/gen']:.1f} s | {med['async/staleness_mean']:.2f} | "
            f"{min(loads):.1f}-{max(loads):.1f} |")
    return "\n".join(lines)


CALIBRATION = "calibration_1thread"


def calibration_job(out: Path, steps: int) -> tuple:
    """``run_job``'s arguments for the synchronous trainer on one thread: the stage times of each
    side of an asynchronous run."""
    return ("main_job", CALIBRATION, ["trainer.num_threads=1", "trainer.val_before_train=false", "data.val_files=null"],
            out, steps, 1, -1)


def stages(summary: dict, steps: int | None = None) -> dict[str, float]:
    """Median generation and rest-of-step seconds over the run's first ``steps`` steps (all: None)."""
    pairs = stage_pairs(summary)[:steps]
    return {"gen_s": statistics.median(gen for gen, _ in pairs),
            "train_s": statistics.median(rest for _, rest in pairs)}


def simulator_check(main_job: dict[str, list[dict]], calibration: dict, measured: dict[str, float]) -> dict:
    """The simulator's speedups predicted from the synchronous runs' stage times (two threads) and
    the one-thread calibration over the same first steps (a step's time changes along a run: the
    first ones train more tokens), with the measured weight push, beside the measured speedups."""
    steps = calibration["steps"]
    sync = [stages(s, steps) for s in main_job["sync"]]
    two = {key: statistics.median_low([run[key] for run in sync]) for key in ("gen_s", "train_s")}
    push = statistics.median_low([s["medians"]["async/weight_push_s"] for s in main_job["one_step"]])
    one = stages(calibration)
    # a separate proximal pass only where the runs made one (not with prox_log_prob_from_update)
    proximal = any(s["medians"].get("timing_s/old_log_prob") for s in main_job["one_step"])
    return {"steps": steps, "two_threads": two, "one_thread": one, "push_s": push, "proximal_pass": proximal,
            "predicted": predict_from_stages(two, one, push, proximal), "measured": measured}


def calibration_run(args: argparse.Namespace) -> dict | None:
    """The one-thread calibration (run, or read back when an earlier benchmark finished it; with
    ``--report-only`` only read back), or None with ``--calibration-steps 0``."""
    if args.calibration_steps <= 0:
        return None
    if args.report_only:
        return finished_run(args.out / CALIBRATION, args.calibration_steps)
    return run_job(*calibration_job(args.out, args.calibration_steps))


def stage_pairs(summary: dict) -> list[tuple[float, float]]:
    """``(generation, rest of the step)`` seconds of every step of a run."""
    return [(gen, step - gen) for gen, step in summary["gen_and_step_s"]]


def corun_pairs(lent_runs: list[dict], calibration: dict) -> tuple[list[float], list[float]]:
    """The generations of the lent ``one_step`` runs that ran on one core beside a computing trainer
    all along (none of their decode steps on lent cores), with the calibration's generation of the
    same step (one thread, alone); its first step is left out (it warms the engine up)."""
    alone, together = [], []
    for run in lent_runs:
        for step in range(1, min(len(run["rollout_gen_s"]), len(calibration["gen_and_step_s"]))):
            seconds, lent_share = run["rollout_gen_s"][step]
            if seconds is not None and lent_share == 0.0:
                alone.append(calibration["gen_and_step_s"][step][0])
                together.append(seconds)
    return alone, together


def lending_check(lent: dict[str, list[dict]], calibration: dict) -> dict:
    """The simulator's ``one_step`` with and without lent cores and ``bounded_lend``, predicted batch
    by batch from each seed's synchronous run (:func:`predict_lent_run`), beside the measured
    speedups. The one-thread factors come from the calibration (seed 1) against the first seed's
    synchronous run over the same first steps, its first left out (the calibration does not validate
    before training, so its first generation also warms the engine up); the co-running slowdown from
    the lent ``one_step`` runs' generations beside a computing trainer against the calibration's
    (:func:`corun_pairs`; 1 when there are none); the push is the lent runs' median. Also the
    ceiling of overlap on these cores (:func:`overlap_ceiling`) and the prediction without the
    co-running slowdown."""
    gen_factor, rest_factor = thread_factors(stage_pairs(lent["sync"][0])[1:], stage_pairs(calibration)[1:])
    alone, together = corun_pairs(lent["one_step_lend"], calibration)
    corun = corun_factor(alone, together) if alone else 1.0
    push = statistics.median_low([s["medians"]["async/weight_push_s"] for s in lent["one_step_lend"]])
    seeds = [{"predicted": predict_lent_run(stage_pairs(sync), gen_factor, rest_factor, push, corun=corun),
              "predicted_no_corun": predict_lent_run(stage_pairs(sync), gen_factor, rest_factor, push),
              "measured": lend["steps_per_hour"] / sync["steps_per_hour"]}
             for sync, lend in zip(lent["sync"], lent["one_step_lend"])]
    return {"gen_factor": gen_factor, "rest_factor": rest_factor, "corun": corun, "corun_generations": len(alone),
            "push_s": push, "ceiling": overlap_ceiling(gen_factor, rest_factor, corun), "seeds": seeds}


def lending_sentence(check: dict) -> str:
    """The lending check in one paragraph of the report."""
    def per_seed(key: str, prediction: str = "predicted") -> str:
        return ", ".join(f"{seed[prediction][key]:.2f}" for seed in check["seeds"])
    return ("Simulator, batch by batch from each seed's synchronous run (one thread: generation "
            f"{check['gen_factor']:.2f}x, the rest {check['rest_factor']:.2f}x slower than two; one core beside "
            f"the other computing: {check['corun']:.2f}x slower again, from {check['corun_generations']} "
            f"generations; push {check['push_s']:.2f} s): predicted one_step_lend {per_seed('one_step_lend/speedup')} "
            f"(one_step unlent {per_seed('one_step/speedup')}; bounded_lend {per_seed('bounded_lend/speedup')}; "
            f"one_step_lend without the co-running slowdown "
            f"{per_seed('one_step_lend/speedup', 'predicted_no_corun')}); measured one_step_lend "
            + ", ".join(f"{seed['measured']:.2f}" for seed in check["seeds"])
            + f". Ceiling of overlap on these cores (balanced sides, no waits, no push): {check['ceiling']:.2f}x.")


def run_schedules(preset: str, schedules: dict[str, list[str]], out: Path, steps: int, seeds: list[int],
                  test_freq: int, report_only: bool = False) -> dict[str, list[dict]]:
    """Every schedule for every seed (seeds outer, so an interrupted benchmark has whole seeds);
    ``report_only``: run nothing, take the seeds whose schedules all finished earlier."""
    summaries: dict[str, list[dict]] = {mode: [] for mode in schedules}
    for seed in seeds:
        names = {mode: f"{preset}_{mode}_seed{seed}" for mode in schedules}
        if report_only:
            runs = {mode: finished_run(out / name, steps) for mode, name in names.items()}
            if None in runs.values():
                print(f"{preset} seed {seed}: left out, not every schedule finished "
                      f"({', '.join(m for m, r in runs.items() if r is None)} missing)", flush=True)
                continue
        else:
            runs = {mode: run_job(preset, names[mode], schedules[mode], out, steps, seed, test_freq)
                    for mode in schedules}
        for mode, run in runs.items():
            summary = {**summarize(run), "seed": seed}
            summaries[mode].append(summary)
            print(f"{names[mode]}: {summary['steps_per_hour']:.0f} steps/h, accuracy {summary['accuracy']}, "
                  f"load {summary['load']}", flush=True)
    return summaries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--test-freq", type=int, default=10)
    parser.add_argument("--tool-steps", type=int, default=24, help="steps of the tool-use job (0: skip it)")
    parser.add_argument("--tool-seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--calibration-steps", type=int, default=10,
                        help="steps of the one-thread calibration run for the simulator check (0: skip both)")
    parser.add_argument("--no-ablation", action="store_true", help="skip the staleness-4 correction ablation")
    parser.add_argument("--ablation-seeds", type=int, default=1,
                        help="run the ablation on the first this many of --seeds (beside their sync runs)")
    parser.add_argument("--lend", action="store_true",
                        help="also one_step and bounded with async_training.lend_idle_cores=true (main job and "
                             "tool job, their seeds)")
    parser.add_argument("--lend-only", action="store_true",
                        help="only sync and the --lend schedules, and the calibration for their simulator check (no "
                             "unlent schedules or ablation)")
    parser.add_argument("--out", type=Path, default=Path("runs/bench_async"))
    parser.add_argument("--json", type=Path, help="also write the report (bench_async.json) here")
    parser.add_argument("--override", nargs="*", default=[], help="key=value overrides for every run")
    parser.add_argument("--report-only", action="store_true",
                        help="run nothing: the tables from the runs in --out that finished (whole seeds only)")
    args = parser.parse_args()
    if (args.lend or args.lend_only) and args.calibration_steps == 1:
        parser.error("--calibration-steps 1 leaves the lending check no step (the calibration's first step warms "
                     "the engine up and is left out): use 0 (no check) or 2 and more")
    EXTRA.extend(args.override)
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M"), "cores": os.cpu_count(),
                              "args": {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()}}
    calibration = calibration_run(args)
    sections = [] if args.lend_only else unlent_sections(args, report, calibration)
    if args.lend or args.lend_only:
        jobs = [("main_job", "main job", args.steps, args.seeds, args.test_freq),
                ("tool_job", "tool-use job", args.tool_steps, args.tool_seeds, args.tool_steps)]
        for preset, title, steps, seeds, test_freq in jobs:
            lent = (run_schedules(preset, {"sync": [], **LENDING}, args.out, steps, seeds, test_freq, args.report_only)
                    if steps > 0 else {})
            if lent.get("sync"):
                report[f"{preset}_lend"] = {"table": compare(lent), "runs": lent}
                sections.append(markdown(f"{title}, idle cores lent", report[f"{preset}_lend"]["table"], lent))
                if preset == "main_job" and calibration is not None:
                    report["lending_simulator"] = lending_check(lent, summarize(calibration))
                    sections.append(lending_sentence(report["lending_simulator"]))
    if args.lend_only and not sections:
        raise SystemExit(f"no seed of the main job finished in sync and every lent schedule in {args.out}")
    text = "\n\n".join(sections)
    for path in filter(None, [args.out / "bench_async.json", args.json]):
        path.write_text(json.dumps(report, indent=1))
    (args.out / "bench_async.md").write_text(text + "\n")
    print(text)


def unlent_sections(args: argparse.Namespace, report: dict[str, Any], calibration: dict | None) -> list[str]:
    """The schedules without lending: the main job (and the simulator check against ``calibration``,
    the one-thread run, when there is one), the tool-use job and the staleness-4 ablation; fills
    ``report`` and returns the markdown tables."""
    only = args.report_only
    main_job = run_schedules("main_job", SCHEDULES, args.out, args.steps, args.seeds, args.test_freq, only)
    if not main_job["sync"]:
        raise SystemExit(f"no seed of the main job finished in every schedule in {args.out}")
    report["main_job"] = {"table": compare(main_job), "runs": main_job}
    seeds = len(main_job["sync"])
    sections = [markdown(f"main job ({seeds} seed{'s' if seeds > 1 else ''})", report["main_job"]["table"], main_job)]
    if calibration is not None:
        report["simulator"] = simulator_check(main_job, summarize(calibration),
                                              {m: report["main_job"]["table"][m]["speedup"] for m in SCHEDULES})
        predicted, measured = report["simulator"]["predicted"], report["simulator"]["measured"]
        sections.append("Simulator (from synchronous stage times only): predicted speedup "
                        f"one_step {predicted['one_step/speedup']:.2f}, bounded {predicted['bounded/speedup']:.2f}; "
                        f"measured {measured['one_step']:.2f}, {measured['bounded']:.2f}.")
    if args.tool_steps > 0:
        tools = run_schedules("tool_job", SCHEDULES, args.out, args.tool_steps, args.tool_seeds, args.tool_steps, only)
        if tools["sync"]:
            report["tool_job"] = {"table": compare(tools), "runs": tools}
            sections.append(markdown("tool-use job", report["tool_job"]["table"], tools))
    if not args.no_ablation:
        seeds = args.seeds[:args.ablation_seeds]
        ablation = run_schedules("main_job", ABLATION, args.out, args.steps, seeds, args.test_freq, only)
        done = [summary["seed"] for summary in next(iter(ablation.values()))]  # report-only: those that finished
        sync = [summary for summary in main_job["sync"] if summary["seed"] in done]
        if done and len(sync) < len(done):
            print(f"ablation: left out, seeds {sorted(set(done) - {summary['seed'] for summary in sync})} have no "
                  "synchronous run to compare with", flush=True)
        elif done:
            ablation = {"sync": sync, **ablation}
            report["ablation"] = {"table": compare(ablation), "runs": ablation}
            sections.append(markdown(f"staleness 4, with and without the decoupled-PPO correction ({len(done)} "
                                     f"seed{'s' if len(done) > 1 else ''})", report["ablation"]["table"], ablation))
    return sections


if __name__ == "__main__":
    main()
