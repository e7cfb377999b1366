"""The hot-path guard: a one-minute rlvr-against-TRL step check, recorded with the commit.

Run it before landing a change to the trainer, the workers or the rollout (``make bench-guard``).
It runs the CPU benchmark of ``benchmarks/bench_grpo_vs_trl.py`` on a short workload (``tiny`` with
32-token responses: 8 prompts x 8 samples; 1 warmup step and 3 measured steps of each framework,
alternating), appends one line to ``benchmarks/results/hot_path_history.jsonl`` (date, commit, machine,
load, the three rlvr/TRL ratios, rlvr's stage times) and compares the step-by-step ratio with the
history's baseline: the median of the last ``--baseline-runs`` entries of the same machine and
workload taken on an idle machine. A ratio more than ``--tolerance`` above the baseline exits 1 and
names the stages that grew; TRL's step is the yardstick of the machine's speed, so the check holds
from one day or machine load to the next. A run on a busy machine (other processes kept more than
half a core busy in the 2 seconds before it starts) is recorded, marked busy, and neither judged nor
used as a baseline. The 1-minute load average is recorded too, but it does not decide: it still counts
a guard or benchmark that has just ended.

Usage::

    python -m benchmarks.hot_path                # run, record, judge
    python -m benchmarks.hot_path --no-record    # run and judge, leave the history alone
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HISTORY = Path(__file__).resolve().parent / "results" / "hot_path_history.jsonl"
HISTORY_IN_REPO = "benchmarks/results/hot_path_history.jsonl"
BUSY_CORES = 0.5  # other processes' CPU use (cores) above which a run is marked busy
BENCH_ARGS = ["--size", "tiny", "--response-len", "32", "--steps", "3", "--warmup", "1", "--device", "cpu"]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--history", type=Path, default=HISTORY, help="the JSONL history file")
    parser.add_argument("--tolerance", type=float, default=0.15,
                        help="fail when the ratio exceeds the baseline by more than this fraction")
    parser.add_argument("--baseline-runs", type=int, default=5, help="idle entries the baseline is the median of")
    parser.add_argument("--no-record", action="store_true", help="do not append this run to the history")
    parser.add_argument("--note", default="", help="a free-text note stored with the entry")
    return parser.parse_args(argv)


def git_commit(repo: Path) -> tuple[str, bool]:
    """``(commit, dirty)`` of the working tree at ``repo`` (``("unknown", False)`` outside git)."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=repo, capture_output=True,
                                text=True, check=True, timeout=10).stdout.strip()
        # the history file itself changes with every recorded run: it does not make the tree dirty
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                 f":(exclude){HISTORY_IN_REPO}"], cwd=repo,
                                capture_output=True, text=True, check=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown", False
    return commit, bool(status.strip())


def busy_cores_now(window_s: float = 2.0) -> float:
    """Cores' worth of CPU time that the machine spent busy over the next ``window_s`` seconds (this
    process sleeps meanwhile, so it is other processes' use: 0.0 idle, 2.0 two cores fully busy)."""
    import psutil

    return psutil.cpu_percent(interval=window_s) / 100.0 * (psutil.cpu_count() or 1)


def entry_from(results: dict, commit: str, dirty: bool, load_1m: float, busy_cores: float, note: str) -> dict:
    """The history line of one benchmark result (``bench_grpo_vs_trl.run``'s dictionary); ``busy_cores``
    is :func:`busy_cores_now` before the run."""
    work = results["workload"]
    return {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit, "dirty": dirty, "machine": results["machine"],
        "workload": f"{work['name']} {work['prompts']}x{work['samples']}x{work['response_len']}",
        "load_1m": round(load_1m, 2), "busy_cores": round(busy_cores, 2), "busy": busy_cores > BUSY_CORES,
        "ratio": round(results["ratio_rlvr_over_trl"], 4),
        "ratio_pairwise": round(results["ratio_pairwise_median"], 4),
        "ratio_cpu": round(results["ratio_cpu"], 4),
        "rlvr_s": round(results["rlvr"]["median_s"], 3), "trl_s": round(results["trl"]["median_s"], 3),
        "rlvr_stages_s": {k: round(v, 3) for k, v in results["rlvr"]["stages_median_s"].items()},
        "versions": results["versions"], "note": note,
    }


def read_history(path: Path) -> list[dict]:
    """Every entry of the history file (none when it does not exist yet)."""
    if not path.exists():
        return []
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    return [json.loads(line) for line in lines]


def baseline(history: list[dict], machine: str, workload: str, runs: int) -> dict | None:
    """The reference of a new entry: the median step-by-step ratio, and each rlvr stage's median share of
    TRL's step, over the last ``runs`` idle entries of the same machine and workload; None when none."""
    same = [e for e in history if e["machine"] == machine and e["workload"] == workload and not e["busy"]][-runs:]
    if not same:
        return None
    stages = {k for e in same for k in e["rlvr_stages_s"]}
    return {"ratio_pairwise": statistics.median(e["ratio_pairwise"] for e in same),
            "stage_share": {k: statistics.median(e["rlvr_stages_s"].get(k, 0.0) / e["trl_s"] for e in same)
                            for k in sorted(stages)},
            "entries": len(same), "commits": [e["commit"] for e in same]}


def verdict(entry: dict, base: dict | None, tolerance: float) -> tuple[bool, str]:
    """``(passed, message)`` of ``entry`` against ``base`` (from :func:`baseline`)."""
    if entry["busy"]:
        return True, (f"not judged: the machine was busy (other processes used {entry.get('busy_cores', '?')} cores, "
                      f"load {entry['load_1m']}); run again on an idle machine")
    if base is None:
        return True, "no baseline yet for this machine and workload: this entry starts one"
    limit = base["ratio_pairwise"] * (1 + tolerance)
    summary = (f"ratio {entry['ratio_pairwise']:.3f} against the baseline {base['ratio_pairwise']:.3f} "
               f"(median of {base['entries']} idle runs: {', '.join(base['commits'])}; limit {limit:.3f})")
    if entry["ratio_pairwise"] <= limit:
        return True, "ok: " + summary
    grown = []
    for name, share in base["stage_share"].items():
        now = entry["rlvr_stages_s"].get(name, 0.0) / entry["trl_s"]
        if now > share * (1 + tolerance) and now - share > 0.002:
            grown.append(f"{name} {share:.4f} -> {now:.4f} of TRL's step")
    return False, "SLOWER: " + summary + ("; grown: " + "; ".join(grown) if grown else "")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from benchmarks import bench_grpo_vs_trl

    repo = Path(__file__).resolve().parents[1]
    load_1m, busy_cores = os.getloadavg()[0], busy_cores_now()
    results = bench_grpo_vs_trl.run(bench_grpo_vs_trl.parse_args(BENCH_ARGS))
    entry = entry_from(results, *git_commit(repo), load_1m, busy_cores, args.note)
    history = read_history(args.history)
    passed, message = verdict(entry, baseline(history, entry["machine"], entry["workload"], args.baseline_runs),
                              args.tolerance)
    if not args.no_record:
        args.history.parent.mkdir(parents=True, exist_ok=True)
        with args.history.open("a") as f:
            f.write(json.dumps(entry) + "\n")
    print(f"\nhot path ({entry['commit']}{' + changes' if entry['dirty'] else ''}): {message}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
