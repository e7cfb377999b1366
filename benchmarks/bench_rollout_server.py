"""The main job's first steps with each rollout setup, per stage, side by side.

Runs the main job (``--preset main_job``) for ``--steps`` steps, once per setup, one after the other
(never two at once), and prints the median seconds of every trainer stage
(``timing_s/gen``, ``old_log_prob``, ``update_actor``, ``update_weights`` and the server engine's
``update_weights/<stage>``), the rollout/actor log-prob gap and the load average, as a Markdown table:

- ``hf``: the HF engine (its fp32 log-probs are reused: no old-log-prob pass);
- ``vllm``: vLLM in the worker's process (``rollout.mode=sync``);
- ``vllm+bypass``: the same with ``algorithm.rollout_correction.bypass_mode=true``;
- ``server``: one managed vLLM replica bound to core 1, training on one thread
  (``rollout.mode=async``);
- ``server+bypass``: the same with ``algorithm.rollout_correction.bypass_mode=true`` (the engine's
  log-probs are the old policy: no old-log-prob pass).

Usage (``make setup-vllm`` first; the trainer runs in the main venv, vLLM in ``.venv-vllm``)::

    .venv/bin/python -m benchmarks.bench_rollout_server --steps 3 --json runs/bench_rollout_server.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

SETUPS = {
    "hf": [],
    "vllm": ["actor_rollout_ref.rollout.name=vllm"],
    "vllm+bypass": ["actor_rollout_ref.rollout.name=vllm", "algorithm.rollout_correction.bypass_mode=true"],
    "server": ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.mode=async",
               "actor_rollout_ref.rollout.server.python=.venv-vllm/bin/python",
               "actor_rollout_ref.rollout.server.cpu_binds=[1]", "trainer.num_threads=1"],
    "server+bypass": ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.mode=async",
                      "actor_rollout_ref.rollout.server.python=.venv-vllm/bin/python",
                      "actor_rollout_ref.rollout.server.cpu_binds=[1]", "trainer.num_threads=1",
                      "algorithm.rollout_correction.bypass_mode=true"],
}
STAGES = ["gen", "old_log_prob", "update_actor", "update_weights", "update_weights/write", "update_weights/reload",
          "step"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3, help="training steps per setup")
    parser.add_argument("--setups", nargs="+", default=list(SETUPS), choices=list(SETUPS))
    parser.add_argument("--out", default="runs/bench_rollout_server", help="run folders go under this one")
    parser.add_argument("--json", default=None, help="also write the results here")
    return parser.parse_args(argv)


def run_setup(name: str, steps: int, out: Path) -> dict:
    """One main-job run of ``steps`` steps; the per-stage medians and the load average."""
    in_process_vllm = name in ("vllm", "vllm+bypass")
    python = ".venv-vllm/bin/python" if in_process_vllm else sys.executable  # in-process vLLM needs its venv
    run_dir = out / name.replace("+", "_")
    command = [python, "-m", "rlvr.trainer.main_ppo", "--preset", "main_job", *SETUPS[name],
               f"trainer.total_training_steps={steps}", "trainer.val_before_train=false", "trainer.test_freq=-1",
               f"trainer.default_local_dir={run_dir}", "trainer.export_hf=false", "trainer.report=false",
               "trainer.progress_bar=false"]
    load_before = os.getloadavg()[0]
    subprocess.run(command, check=True, timeout=7200)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps_rows = [row for row in rows if "timing_s/step" in row]
    result = {"load_average": [load_before, os.getloadavg()[0]]}
    for stage in STAGES:
        values = [row[f"timing_s/{stage}"] for row in steps_rows if f"timing_s/{stage}" in row]
        result[stage] = statistics.median(values) if values else None
    gaps = [row["training/rollout_log_probs_diff_max"] for row in steps_rows
            if "training/rollout_log_probs_diff_max" in row]
    result["log_prob_diff_max"] = max(gaps) if gaps else None
    return result


def table(results: dict[str, dict]) -> str:
    names = list(results)
    lines = ["| stage (median s) | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for key in [*STAGES, "log_prob_diff_max"]:
        cells = [results[n][key] for n in names]
        lines.append(f"| {key} | " + " | ".join("-" if c is None else f"{c:.3g}" for c in cells) + " |")
    loads = [results[n]["load_average"] for n in names]
    lines.append("| load average (before, after) | " + " | ".join(f"{a:.1f}, {b:.1f}" for a, b in loads) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    out = Path(args.out)
    results = {name: run_setup(name, args.steps, out) for name in args.setups}
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
