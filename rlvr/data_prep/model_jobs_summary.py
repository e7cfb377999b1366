"""Summaries of the model jobs: a learned reward model as the only reward (``make train-rm``),
on-policy distillation (``make train-distill``) and the MoE job's two runs (``make train-moe``), each
a ``summary.md`` / ``summary.json`` and a plot in its run folder::

    python -m rlvr.data_prep.model_jobs_summary rm runs/rlvr/rm_job --rm-summary runs/rlvr/rm_model/rm_summary.json
    python -m rlvr.data_prep.model_jobs_summary distill runs/rlvr/distill_job --baseline runs/rlvr/main_job
    python -m rlvr.data_prep.model_jobs_summary moe runs/moe/R3 --baseline runs/moe/disabled

- **rm**: the reward model's held-out pair accuracy (from the RM trainer), the policy's held-out
  greedy accuracy measured by the rule (``val/acc``) before and after, and the reward model's mean
  score beside the rule's sampled accuracy over the run (``rm_vs_rule.png``: when the reward model's
  score keeps rising while the rule's accuracy does not, the policy is hacking the reward model).
- **distill**: the student's held-out accuracy by step beside GRPO alone from the same start (the
  main job's run), the teacher's accuracy (the main job's final ``val/acc``: the teacher is its
  exported model), and the first step at which each run came within 5 points of it
  (``distill_vs_grpo.png``).
- **moe**: the MoE job with rollout routing replay (R3) beside the same run without it: held-out
  accuracy by step, and the rollout/training mismatch of each step, ``|log p_rollout - log p_actor|``
  over the response tokens (mean and max, ``training/rollout_log_probs_diff_*``): its mean over the
  run's steps and its largest value (``moe_replay.png``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rlvr.trainer.report import metric_series
from rlvr.trainer.tracking import read_metrics

__all__ = ["rm_summary", "distill_summary", "moe_summary", "first_step_within", "main"]

WITHIN_POINTS = 5.0


def _val_curve(rows: list[dict[str, Any]]) -> dict[int, float]:
    return {int(row["step"]): float(row["val/acc"]) for row in rows if "val/acc" in row}


def _step_seconds(rows: list[dict[str, Any]]) -> list[float]:
    """Each training step's wall time (``timing_s/step``), in order."""
    return [float(row["timing_s/step"]) for row in rows if "timing_s/step" in row]


def _series(curve: dict) -> tuple[list[int], list[float]]:
    """``{step: value}`` as the ``(steps, values)`` a plot takes."""
    return [int(step) for step in curve], [float(value) for value in curve.values()]


def first_step_within(curve: dict[int, float], target: float, points: float = WITHIN_POINTS) -> int | None:
    """The first step whose accuracy is at most ``points`` (percentage points) below ``target``."""
    return next((step for step, acc in sorted(curve.items()) if 100 * (target - acc) <= points), None)


def _plot(path: Path, title: str, left: dict[str, tuple[list[int], list[float]]],
          right: dict[str, tuple[list[int], list[float]]], left_label: str, right_label: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (label, (steps, values)) in enumerate(left.items()):
        ax.plot(steps, values, color=("tab:red", "tab:orange")[i % 2], label=label)
    ax.set_xlabel("step")
    ax.set_ylabel(left_label)
    # a second axis only beside left-hand series: alone, the right-hand ones take the main axis
    other = (ax.twinx() if left else ax) if right else None
    for i, (label, (steps, values)) in enumerate(right.items()):
        other.plot(steps, values, marker="o", markersize=3, color=("tab:blue", "tab:green", "tab:purple")[i % 3],
                   label=label)
    if other is not None:
        other.set_ylabel(right_label)
        other.set_ylim(0, 1.02)
    axes = [ax] if other in (None, ax) else [ax, other]
    handles = [h for a in axes for h in a.get_legend_handles_labels()[0]]
    labels = [lbl for a in axes for lbl in a.get_legend_handles_labels()[1]]
    ax.legend(handles, labels, fontsize=7, loc="lower right")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def rm_summary(run_dir: str | Path, rm_summary_file: str | Path) -> dict[str, Any]:
    """Summarise a run with the reward model as its only reward (see the module docstring)."""
    run_dir = Path(run_dir)
    rows = read_metrics(run_dir / "metrics.jsonl")
    rm = json.loads(Path(rm_summary_file).read_text())
    val = _val_curve(rows)
    step_seconds = _step_seconds(rows)
    rm_score = metric_series(rows, "reward/*/reward_model/mean_score")
    rule = {"rule's accuracy of the samples (train/acc)": metric_series(rows, "train/acc")["train/acc"],
            "held-out greedy accuracy by the rule (val/acc)": _series(val)}
    _plot(run_dir / "rm_vs_rule.png", "reward model's score (the reward) beside the rule's accuracy",
          {f"reward model's mean score ({key.split('/')[1]})": curve for key, curve in rm_score.items()}, rule,
          "reward-model score", "accuracy by the rule")
    first, last = min(val), max(val)
    result = {"rm_val_pair_accuracy": rm["val_pair_accuracy_after"], "rm_val_pair_accuracy_untrained": rm["val_pair_accuracy_before"],
              "rm_train_pairs": rm["train_pairs"], "val_acc_before": val[first], "val_acc_after": val[last],
              "gain_points": 100 * (val[last] - val[first]), "steps": len(step_seconds),
              "train_s": sum(step_seconds), "val_acc_by_step": val,
              "rm_score_first_last": {k: (v[1][0], v[1][-1]) for k, v in rm_score.items()},
              "train_acc_first_last": (rule["rule's accuracy of the samples (train/acc)"][1][0],
                                       rule["rule's accuracy of the samples (train/acc)"][1][-1])}
    (run_dir / "summary.json").write_text(json.dumps(result, indent=1) + "\n")
    (run_dir / "summary.md").write_text("\n".join([
        "# GRPO with a learned reward model as the only reward", "",
        f"- reward model: held-out pair accuracy {100 * result['rm_val_pair_accuracy']:.1f}% "
        f"(untrained head {100 * result['rm_val_pair_accuracy_untrained']:.1f}%), {result['rm_train_pairs']} training pairs",
        f"- policy, held-out greedy accuracy by the rule: {100 * result['val_acc_before']:.0f}% -> "
        f"{100 * result['val_acc_after']:.0f}% ({result['gain_points']:+.0f} points) in {result['steps']} steps, "
        f"{result['train_s']:.0f} s of training", f"- by step: {val}",
        f"- reward model's mean score first -> last step: {result['rm_score_first_last']}; the rule's sampled "
        f"accuracy: {result['train_acc_first_last']}", "", "![reward model vs rule](rm_vs_rule.png)", ""]))
    return result


def distill_summary(run_dir: str | Path, baseline_dir: str | Path) -> dict[str, Any]:
    """Summarise a distillation run against GRPO alone from the same start (module docstring)."""
    run_dir, baseline_dir = Path(run_dir), Path(baseline_dir)
    student, grpo = _val_curve(read_metrics(run_dir / "metrics.jsonl")), _val_curve(read_metrics(baseline_dir / "metrics.jsonl"))
    teacher = grpo[max(grpo)]
    _plot(run_dir / "distill_vs_grpo.png", f"held-out accuracy; teacher {100 * teacher:.0f}%", {},
          {"distillation + GRPO (student)": _series(student), "GRPO alone (the teacher's run)": _series(grpo)},
          "", "held-out greedy accuracy")
    result = {"teacher_acc": teacher, "student_by_step": student, "grpo_by_step": grpo,
              "student_first_within_5": first_step_within(student, teacher),
              "grpo_first_within_5": first_step_within(grpo, teacher)}
    (run_dir / "summary.json").write_text(json.dumps(result, indent=1) + "\n")
    (run_dir / "summary.md").write_text("\n".join([
        "# On-policy distillation from the main job's model", "",
        f"- teacher (the main job's final model): {100 * teacher:.0f}% held-out greedy accuracy",
        f"- student (untrained start), by step: {student}", f"- GRPO alone from the same start, by step: {grpo}",
        f"- first step within {WITHIN_POINTS:g} points of the teacher: distillation {result['student_first_within_5']}, "
        f"GRPO alone {result['grpo_first_within_5']}", "", "![distillation vs GRPO](distill_vs_grpo.png)", ""]))
    return result


MISMATCH_MEAN, MISMATCH_MAX = "training/rollout_log_probs_diff_mean", "training/rollout_log_probs_diff_max"


def _mismatch(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A run's per-step mismatch: the steps' mean ``|Δ log p|`` averaged and their largest max."""
    means = metric_series(rows, MISMATCH_MEAN).get(MISMATCH_MEAN, ([], []))
    maxes = metric_series(rows, MISMATCH_MAX).get(MISMATCH_MAX, ([], []))
    if not means[1]:
        raise ValueError(f"no {MISMATCH_MEAN} in the run's metrics: the MoE job logs it every step")
    step_seconds = _step_seconds(rows)
    return {"val_acc_by_step": _val_curve(rows), "mismatch_mean": sum(means[1]) / len(means[1]),
            "mismatch_max": max(maxes[1]), "mismatch_mean_by_step": dict(zip(*means)),
            "steps": len(step_seconds), "s_per_step": sum(step_seconds) / max(1, len(step_seconds))}


def moe_summary(run_dir: str | Path, baseline_dir: str | Path) -> dict[str, Any]:
    """Summarise the MoE job's run with routing replay against the run without it (module docstring)."""
    run_dir, baseline_dir = Path(run_dir), Path(baseline_dir)
    replay, plain = _mismatch(read_metrics(run_dir / "metrics.jsonl")), _mismatch(read_metrics(baseline_dir / "metrics.jsonl"))
    _plot(run_dir / "moe_replay.png", "MoE job: routing replay (R3) against none",
          {"mean |Δlog p| rollout vs actor, R3": _series(replay["mismatch_mean_by_step"]),
           "mean |Δlog p| rollout vs actor, no replay": _series(plain["mismatch_mean_by_step"])},
          {"held-out accuracy, R3": _series(replay["val_acc_by_step"]),
           "held-out accuracy, no replay": _series(plain["val_acc_by_step"])},
          "mean |Δ log p| per step", "held-out greedy accuracy")
    result = {"replay": replay, "no_replay": plain,
              "mismatch_mean_ratio": replay["mismatch_mean"] / plain["mismatch_mean"],
              "mismatch_max_ratio": replay["mismatch_max"] / plain["mismatch_max"]}
    (run_dir / "summary.json").write_text(json.dumps(result, indent=1) + "\n")
    rows = [f"| {name} | {run['val_acc_by_step']} | {run['mismatch_mean']:.4f} | {run['mismatch_max']:.3f} | "
            f"{run['s_per_step']:.0f} |" for name, run in (("R3", replay), ("no replay", plain))]
    (run_dir / "summary.md").write_text("\n".join([
        "# The MoE job: rollout routing replay (R3) against none", "",
        "| run | held-out accuracy by step | mean \\|Δlog p\\| | max \\|Δlog p\\| | s/step |", "|---|---|---|---|---|",
        *rows, "", f"R3 / none: mean mismatch x{result['mismatch_mean_ratio']:.2f}, "
        f"max x{result['mismatch_max_ratio']:.2f}", "", "![routing replay](moe_replay.png)", ""]))
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="job", required=True)
    rm = sub.add_parser("rm", help="GRPO with the learned reward model")
    rm.add_argument("run")
    rm.add_argument("--rm-summary", default="runs/rlvr/rm_model/rm_summary.json")
    distill = sub.add_parser("distill", help="on-policy distillation")
    distill.add_argument("run")
    distill.add_argument("--baseline", default="runs/rlvr/main_job")
    moe = sub.add_parser("moe", help="the MoE job: routing replay against none")
    moe.add_argument("run", help="the run with router_replay.mode=R3")
    moe.add_argument("--baseline", default="runs/moe/disabled", help="the run without routing replay")
    args = parser.parse_args(argv)
    result = (rm_summary(args.run, args.rm_summary) if args.job == "rm" else
              distill_summary(args.run, args.baseline) if args.job == "distill" else moe_summary(args.run, args.baseline))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
