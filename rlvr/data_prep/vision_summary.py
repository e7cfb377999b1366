"""The vision job's summary: held-out accuracy before the warm start, after it and after RL, with
sample images and the model's answers at each stage.

For each run folder (``runs/vision/seed<N>``, as ``make train-vision`` leaves it: ``warm/warm_start.json``
from the warm start, ``rl/`` from the RL run with the trained model exported to ``rl/hf_model``),
the trained model is evaluated the way the warm start evaluated the others
(:func:`rlvr.data_prep.vision_warm_start.evaluate`: greedy, the held-out questions, ``acc`` and
``mentions``), and ``summary.md`` / ``summary.json`` are written beside them. With several run
folders a table of all of them is printed::

    python -m rlvr.data_prep.vision_summary runs/vision/seed1 runs/vision/seed2 runs/vision/seed3
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from rlvr.data_prep.vision_warm_start import evaluate
from rlvr.trainer.tracking import read_metrics
from rlvr.utils.model import load_causal_lm
from rlvr.utils.tokenizer import hf_processor

__all__ = ["STAGES", "summarize", "stage_table", "main"]

STAGES = ("before warm start", "after warm start", "after RL")
_SAMPLES = 8


def _rl_facts(rl_dir: Path) -> dict[str, Any]:
    """Steps, training time and the trainer's own ``val/acc`` curve of the RL run."""
    rows = read_metrics(rl_dir / "metrics.jsonl")
    steps = [r for r in rows if "timing_s/step" in r]
    return {"steps": len(steps), "train_s": sum(r["timing_s/step"] for r in steps),
            "val_acc": {int(r["step"]): r["val/acc"] for r in rows if "val/acc" in r}}


def summarize(run_dir: str | Path, test_file: str | Path) -> dict[str, Any]:
    """Evaluate the run's RL model and write ``summary.json`` and ``summary.md`` into ``run_dir``."""
    run_dir = Path(run_dir)
    warm = json.loads((run_dir / "warm" / "warm_start.json").read_text(encoding="utf-8"))
    exported = run_dir / "rl" / "hf_model"
    after_rl = evaluate(load_causal_lm(exported).eval(), hf_processor(exported), test_file)
    result = {"seed": warm["seed"], "warm_start_steps": warm["steps"], "warm_start_s": warm["warm_start_s"],
              "load_average_warm_start": [warm["load_average_start"], warm["load_average_end"]],
              "rl": _rl_facts(run_dir / "rl"),
              "stages": dict(zip(STAGES, (warm["before"], warm["after"], after_rl), strict=True))}
    (run_dir / "summary.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    (run_dir / "summary.md").write_text(_markdown(result, Path(test_file).parent, run_dir), encoding="utf-8")
    return result


def stage_table(results: list[dict[str, Any]]) -> str:
    """A markdown table: one row per run, greedy held-out accuracy at each stage (``mentions`` in
    brackets), the RL gain, steps and training times."""
    lines = ["| seed | " + " | ".join(STAGES) + " | RL gain | warm start | RL steps (training s) |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        cells = [f"{100 * r['stages'][s]['acc']:.0f}% ({100 * r['stages'][s]['mentions']:.0f}%)" for s in STAGES]
        gain = 100 * (r["stages"][STAGES[2]]["acc"] - r["stages"][STAGES[1]]["acc"])
        lines.append(f"| {r['seed']} | " + " | ".join(cells) + f" | {gain:+.0f} | {r['warm_start_steps']} steps, "
                     f"{r['warm_start_s']:.0f} s | {r['rl']['steps']} ({r['rl']['train_s']:.0f} s) |")
    return "\n".join(lines)


def _markdown(result: dict[str, Any], data_dir: Path, run_dir: Path) -> str:
    rows = ["| image | question | truth | " + " | ".join(STAGES) + " |", "|---|---|---|---|---|---|"]
    samples = [result["stages"][s]["samples"] for s in STAGES]
    for i in range(min(_SAMPLES, len(samples[0]))):
        first = samples[0][i]
        image = Path(data_dir, first["image"]).resolve()
        answers = " | ".join(f"{s[i]['answer']!r} {'✓' if s[i]['acc'] else '✗'}" for s in samples)
        rows.append(f'| <img src="{os.path.relpath(image, run_dir.resolve())}" width="48"> | {first["question"]} | '
                    f"{first['truth']} | {answers} |")
    return "\n".join([f"# Vision job, seed {result['seed']}", "",
                      "Held-out greedy accuracy (one-word answers; in brackets: the right word mentioned in any form):",
                      "", stage_table([result]), "", f"The trainer's own val/acc by step: {result['rl']['val_acc']}",
                      "", "## Sample images and answers", "", *rows, ""])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="run folders (runs/vision/seed<N>)")
    parser.add_argument("--test", default="data/vision/test.jsonl", help="the held-out questions")
    args = parser.parse_args(argv)
    print(stage_table([summarize(run, args.test) for run in args.runs]))


if __name__ == "__main__":
    main()
