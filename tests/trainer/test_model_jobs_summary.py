"""The summaries of the reward-model, distillation and MoE jobs from metrics files written by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlvr.data_prep.model_jobs_summary import distill_summary, first_step_within, moe_summary, rm_summary


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


def test_moe_summary_compares_routing_replay_with_none(tmp_path):
    def run(name, means, maxes, val):
        rows = [{"step": 0, "val/acc": val[0]}]
        rows += [{"step": i + 1, "timing_s/step": 60.0 + i, "training/rollout_log_probs_diff_mean": m,
                  "training/rollout_log_probs_diff_max": x} for i, (m, x) in enumerate(zip(means, maxes))]
        _metrics(tmp_path / name, rows + [{"step": len(means), "val/acc": val[1]}])

    run("R3", [0.01, 0.03], [0.2, 0.4], (0.5, 0.7))
    run("disabled", [0.04, 0.06], [0.9, 1.6], (0.5, 0.6))
    result = moe_summary(tmp_path / "R3", tmp_path / "disabled")
    assert result["replay"]["mismatch_mean"] == pytest.approx(0.02) and result["replay"]["mismatch_max"] == 0.4
    assert result["no_replay"]["mismatch_mean"] == pytest.approx(0.05) and result["no_replay"]["mismatch_max"] == 1.6
    assert result["mismatch_mean_ratio"] == pytest.approx(0.4) and result["mismatch_max_ratio"] == pytest.approx(0.25)
    assert result["replay"]["val_acc_by_step"] == {0: 0.5, 2: 0.7} and result["replay"]["s_per_step"] == 60.5
    assert (tmp_path / "R3" / "moe_replay.png").stat().st_size > 0
    assert "| R3 | {0: 0.5, 2: 0.7} | 0.0200 | 0.400 | 60 |" in (tmp_path / "R3" / "summary.md").read_text()
    _metrics(tmp_path / "dense", [{"step": 0, "val/acc": 0.5}])
    with pytest.raises(ValueError, match="rollout_log_probs_diff_mean"):
        moe_summary(tmp_path / "R3", tmp_path / "dense")
