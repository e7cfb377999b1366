"""Benchmark: how long the ``rlvr`` command takes to report a config error (target: under 3 s).

Each case runs ``python -m rlvr.trainer.main_ppo`` in a fresh interpreter, as a user would, and
times it from start to exit: a misspelt key, a misspelt registry name, batch sizes that do not
divide, and a valid config with ``--dry-run`` (check + derived settings). It also reports whether
torch, Ray or transformers were imported (they must not be).

    python -m benchmarks.bench_cli [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROBE = ("import sys, runpy; sys.argv = ['rlvr', *sys.argv[1:]]\n"
         "try:\n    runpy.run_module('rlvr.trainer.main_ppo', run_name='__main__')\n"
         "finally:\n    print('HEAVY', sorted(m for m in ('torch', 'ray', 'transformers') if m in sys.modules), "
         "file=sys.stderr)\n")


def cases(train_file: Path) -> dict[str, list[str]]:
    data = f"data.train_files={train_file}"
    return {
        "misspelt key": ["--preset", "grpo", data, "trainer.seedd=3"],
        "misspelt estimator": ["--preset", "grpo", data, "algorithm.adv_estimator=grpoo"],
        "batch sizes do not divide": ["--preset", "grpo", data, "data.train_batch_size=6"],
        "valid config, --dry-run": ["--preset", "main_job", data, "data.val_files=null", "--dry-run"],
    }


def time_case(argv: list[str], repeats: int) -> tuple[float, int, str]:
    """Median seconds, exit code and the heavy modules imported."""
    seconds, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = subprocess.run([sys.executable, "-c", PROBE, *argv], cwd=REPO, capture_output=True, text=True)
        seconds.append(time.perf_counter() - start)
    heavy = result.stderr.rsplit("HEAVY ", 1)[-1].strip()
    return statistics.median(seconds), result.returncode, heavy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs per case (the median is reported)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        train = Path(tmp) / "train.jsonl"
        train.write_text("{}\n")
        print("| case | exit code | seconds (median) | torch / Ray / transformers imported |\n|---|---|---|---|")
        for name, argv in cases(train).items():
            seconds, code, heavy = time_case(argv, args.repeats)
            print(f"| {name} | {code} | {seconds:.2f} | {heavy} |", flush=True)


if __name__ == "__main__":
    main()
