"""The end-of-run report: ``<run dir>/report.md`` with PNG curves and a table of sample generations
(with their images, for a vision-language model: PNGs in ``<run dir>/samples``).

Plots are drawn with matplotlib's ``Agg`` backend (no display needed) from the rows of
``metrics.jsonl``; a curve whose metrics never appeared is left out.
"""

from __future__ import annotations

import html
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

PLOTS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("reward", "reward (mean sequence score)", ("critic/score/mean", "critic/rewards/mean",
                                                "train/unfiltered_score_mean")),
    ("accuracy", "accuracy", ("train/acc", "train/unfiltered_acc", "val/*/acc")),
    ("val_accuracy", "held-out accuracy (greedy)", ("val/*/acc",)),
    ("kl", "KL to the reference / old policy", ("actor/kl_loss", "actor/reward_kl_penalty", "actor/ppo_kl")),
    ("entropy", "policy entropy (nats/token)", ("actor/entropy",)),
    ("response_length", "response length (tokens)", ("response_length/mean", "response_length/max")),
    ("step_time", "step time (s)", ("timing_s/step", "timing_s/gen", "timing_s/update_actor")),
    ("reward_model", "reward model's score beside the rule (reward hacking: they part)",
     ("reward/*/reward_model/mean_score", "reward_model/*/mean_score", "train/acc")),
    ("distillation", "distillation loss to the teacher", ("distillation/loss", "distillation/teacher_log_prob")),
)


def metric_series(rows: Sequence[dict[str, Any]], pattern: str) -> dict[str, tuple[list[int], list[float]]]:
    """``{metric: (steps, values)}`` for the metric names matching ``pattern`` (one ``*`` allowed)."""
    prefix, _, suffix = pattern.partition("*")
    wildcard = "*" in pattern
    out: dict[str, tuple[list[int], list[float]]] = {}
    for row in rows:
        for key, value in row.items():
            matches = key.startswith(prefix) and key.endswith(suffix) if wildcard else key == pattern
            if matches and isinstance(value, (int, float)) and key != "step":
                steps, values = out.setdefault(key, ([], []))
                steps.append(int(row["step"]))
                values.append(float(value))
    return out


def plot_metrics(rows: Sequence[dict[str, Any]], out_dir: str | os.PathLike) -> list[Path]:
    """One PNG per entry of :data:`PLOTS` that has data; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, title, patterns in PLOTS:
        curves = {k: v for pattern in patterns for k, v in metric_series(rows, pattern).items()}
        if not curves:
            continue
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for label, (steps, values) in sorted(curves.items()):
            ax.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3, label=label)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = out_dir / f"{name}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def _cell(text: Any, limit: int = 300) -> str:
    text = str(text)
    text = text if len(text) <= limit else text[:limit] + " …"
    return html.escape(text).replace("|", "&#124;").replace("\n", "<br>")


def generations_table(generations: Sequence[dict[str, Any]], image_files: Sequence[Sequence[str]] = ()) -> str:
    """A markdown table of sample generations (keys ``step``, ``prompt``, ``response``,
    ``ground_truth``, ``score``), with a column of the samples' images when ``image_files`` (paths
    relative to the report, one list per generation) holds any."""
    with_images = any(image_files)
    head = "| step | images | prompt | response | ground truth | score |" if with_images else \
        "| step | prompt | response | ground truth | score |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for i, g in enumerate(generations):
        pictures = " ".join(f'<img src="{path}" width="64">' for path in image_files[i]) if with_images else None
        lines.append(f"| {g['step']} | " + (f"{pictures} | " if with_images else "") + f"{_cell(g['prompt'])} | "
                     f"{_cell(g['response'])} | {_cell(g['ground_truth'])} | {float(g['score']):.3f} |")
    return "\n".join(lines)


def save_sample_images(generations: Sequence[dict[str, Any]], run_dir: Path) -> list[list[str]]:
    """Write the images of the generations (``images``: PIL images, if any) as PNGs to
    ``<run_dir>/samples``; returns their paths relative to ``run_dir``, one list per generation."""
    paths = []
    for i, g in enumerate(generations):
        names = []
        for k, image in enumerate(g.get("images") or []):
            name = f"samples/step{g['step']}_{i}_{k}.png"
            (run_dir / "samples").mkdir(parents=True, exist_ok=True)
            image.save(run_dir / name)
            names.append(name)
        paths.append(names)
    return paths


def _summary_table(summary: dict[str, Any]) -> str:
    lines = ["| | |", "|---|---|"]
    lines += [f"| {key} | {value:.4g} |" if isinstance(value, float) else f"| {key} | {value} |"
              for key, value in summary.items()]
    return "\n".join(lines)


def metric_summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Headline numbers of a run's metric rows: the first and last ``val/acc`` (and, for tool-using
    runs, the share of samples that called a tool and of correct answers that did), the ``val/acc``
    curve (``step: accuracy``) and the mean step time."""
    summary: dict[str, Any] = {}
    for key in ("val/acc", "val/agent/tool_use_rate", "val/agent/correct_with_tool"):
        val_rows = [r for r in rows if key in r]
        if val_rows:
            summary[f"{key} before (step {val_rows[0]['step']})"] = val_rows[0][key]
            summary[f"{key} after (step {val_rows[-1]['step']})"] = val_rows[-1][key]
            if key == "val/acc":
                summary["val/acc by step"] = ", ".join(f"{r['step']}: {r[key]:.2f}" for r in val_rows)
    step_times = [r["timing_s/step"] for r in rows if "timing_s/step" in r]
    if step_times:
        summary["mean step time (s)"] = sum(step_times) / len(step_times)
    return summary


def first_and_last_generations(generations: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The sample generations of the first and the last step that has any."""
    steps = sorted({g["step"] for g in generations})
    return [g for g in generations if g["step"] in (steps[:1] + steps[-1:])]


def restarts_table(restarts: Sequence[dict[str, Any]]) -> str:
    """A markdown table of worker restarts (rows from ``Recovery.report_rows``)."""
    lines = ["| failed at step | worker group | method | rank | cause | restored step | steps redone | "
             "recovery (s) |", "|---|---|---|---|---|---|---|---|"]
    for r in restarts:
        restored = "— (group restarted alone)" if r["restored_step"] is None else r["restored_step"]
        lines.append(f"| {r['failed_step']} | {_cell(r['group'])} | {r['method']} | {r['rank']} | {r['cause']} | "
                     f"{restored} | {r['steps_redone']} | {r['seconds']:.1f} |")
    return "\n".join(lines)


def write_report(run_dir: str | os.PathLike, rows: Sequence[dict[str, Any]],
                 generations: Sequence[dict[str, Any]], summary: dict[str, Any],
                 restarts: Sequence[dict[str, Any]] = ()) -> Path:
    """Write ``<run_dir>/report.md`` and its PNGs (in ``<run_dir>/plots``).

    Args:
        run_dir: the run directory.
        rows: metric rows (``{"step": k, name: value, ...}``), e.g. from ``metrics.jsonl``.
        generations: sample generations for the table (validation samples, first and last).
        summary: headline numbers (accuracy before/after, steps, wall time, ...).
        restarts: the worker restarts of the run (a section is written when there are any).

    Returns:
        The path of ``report.md``.
    """
    run_dir = Path(run_dir)
    plots = plot_metrics(rows, run_dir / "plots")
    parts = ["# rlvr run report", "", "## Summary", "", _summary_table(summary), "", "## Curves", ""]
    parts += [f"![{p.stem}](plots/{p.name})" for p in plots] or ["(no metrics were logged)"]
    if restarts:
        parts += ["", "## Worker restarts", "", restarts_table(restarts)]
    table = generations_table(generations, save_sample_images(generations, run_dir)) if generations else "(none)"
    parts += ["", "## Sample generations", "", table, ""]
    path = run_dir / "report.md"
    path.write_text("\n".join(parts), encoding="utf-8")
    return path
