"""The summaries of the reward-model and distillation jobs from metrics files written by hand."""

from __future__ import annotations

import json
from pathlib import Path

from rlvr.data_prep.model_jobs_summary import distill_summary, first_step_within, rm_summary


def _metrics(path: Path, rows: list[dict]) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_first_step_within_five_points():
    assert first_step_within({0: 0.5, 10: 0.90, 20: 0.92}, 0.96) == 20
    assert first_step_within({0: 0.5, 10: 0.91}, 0.96) == 10
    assert first_step_within({0: 0.5}, 0.96) is None


def test_rm_summary_reads_the_run_and_the_reward_model(tmp_path):
    run = tmp_path / "rm_job"
    _metrics(run, [{"step": 0, "val/acc": 0.5},
                   {"step": 1, "timing_s/step": 10.0, "reward/arith/reward_model/mean_score": -1.0, "train/acc": 0.4},
                   {"step": 2, "timing_s/step": 12.0, "reward/arith/reward_model/mean_score": 2.5, "train/acc": 0.6},
                   {"step": 2, "val/acc": 0.85}])
    (tmp_path / "rm.json").write_text(json.dumps({"val_pair_accuracy_after": 0.9, "val_pair_accuracy_before": 0.5,
                                                  "train_pairs": 100}))
    result = rm_summary(run, tmp_path / "rm.json")
    assert result["gain_points"] == 35.0 and result["steps"] == 2 and result["train_s"] == 22.0
    assert result["rm_score_first_last"] == {"reward/arith/reward_model/mean_score": (-1.0, 2.5)}
    assert result["train_acc_first_last"] == (0.4, 0.6)
    assert (run / "rm_vs_rule.png").stat().st_size > 0 and "+35 points" in (run / "summary.md").read_text()


def test_distill_summary_compares_with_grpo_alone(tmp_path):
    _metrics(tmp_path / "main_job", [{"step": 0, "val/acc": 0.5}, {"step": 10, "val/acc": 0.8}, {"step": 20, "val/acc": 0.96}])
    _metrics(tmp_path / "distill", [{"step": 0, "val/acc": 0.5}, {"step": 5, "val/acc": 0.93}, {"step": 10, "val/acc": 0.95}])
    result = distill_summary(tmp_path / "distill", tmp_path / "main_job")
    assert result["teacher_acc"] == 0.96
    assert (result["student_first_within_5"], result["grpo_first_within_5"]) == (5, 20)
    assert (tmp_path / "distill" / "distill_vs_grpo.png").stat().st_size > 0
