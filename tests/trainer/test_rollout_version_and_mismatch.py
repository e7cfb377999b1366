"""Trust, then verify, every step: the weight-version guard catches a stale rollout engine, the
HF engine reports a zero rollout/actor mismatch, and the rollout correction reaches the trainer's
metrics (tiny model, local backend)."""

from __future__ import annotations

import pytest
from trainer_helpers import tiny_config

from rlvr.trainer.main_ppo import run_ppo
from rlvr.trainer.tracking import read_metrics
from rlvr.utils.errors import StaleRolloutError
from rlvr.workers.rollout import HFRollout


def test_a_stale_rollout_engine_is_refused(tiny_model_dir, tiny_data, tmp_path, monkeypatch):
    """The engine silently skips every weight sync after the first: the second step's samples come
    from version 0 while the actor is at version 1, and the trainer refuses them."""
    real_update = HFRollout.update_weights

    def stale_update(self, weights, version):
        if version == 0:
            real_update(self, weights, version)

    monkeypatch.setattr(HFRollout, "update_weights", stale_update)
    cfg = tiny_config(tiny_model_dir, tiny_data, tmp_path / "run", **{"trainer.total_training_steps": 3})
    with pytest.raises(StaleRolloutError, match="weights version 0, but the actor is at version 1") as info:
        run_ppo(cfg)
    assert any("trainer stage 'gen'" in note for note in info.value.__notes__)
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [row["step"] for row in rows] == [0, 1]  # validation and step 1 ran on version 0; step 2 refused


MISMATCH_METRICS = [
    "training/rollout_probs_diff_max", "training/rollout_probs_diff_mean", "training/rollout_probs_diff_std",
    "training/rollout_log_probs_diff_max", "training/rollout_log_probs_diff_mean",
    "training/rollout_log_probs_diff_frac_over", "rollout_corr/kl", "rollout_corr/k3_kl",
]


def test_hf_engine_reports_zero_mismatch_and_the_correction_metrics(tiny_model_dir, tiny_data, tmp_path):
    cfg = tiny_config(tiny_model_dir, tiny_data, tmp_path / "run", **{
        "trainer.total_training_steps": 2, "algorithm.rollout_correction.rollout_is": "token",
        "algorithm.rollout_correction.rollout_rs": "sequence"})
    run_ppo(cfg)
    steps = [row for row in read_metrics(tmp_path / "run" / "metrics.jsonl") if "timing_s/step" in row]
    assert len(steps) == 2
    for row in steps:
        assert row["actor/reused_rollout_log_probs"] == 1.0  # fp32 HF log-probs are exact and reused
        assert row["training/rollout_probs_diff_valid"] == 1.0
        assert all(row[name] == 0.0 for name in MISMATCH_METRICS), {name: row[name] for name in MISMATCH_METRICS}
        assert row["rollout_corr/rollout_is_mean"] == 1.0 and row["rollout_corr/rollout_is_ratio_fraction_high"] == 0.0
        assert row["rollout_corr/rollout_rs_masked_fraction"] == 0.0
        assert row["timing_s/update_weights"] >= 0.0


def test_recomputed_log_probs_show_the_small_fp32_gap(tiny_model_dir, tiny_data, tmp_path):
    """With reuse off the actor recomputes old log-probs in another kernel order: a real, tiny gap."""
    cfg = tiny_config(tiny_model_dir, tiny_data, tmp_path / "run", **{
        "trainer.total_training_steps": 1, "actor_rollout_ref.actor.use_rollout_log_probs": False})
    run_ppo(cfg)
    row = next(row for row in read_metrics(tmp_path / "run" / "metrics.jsonl") if "timing_s/step" in row)
    assert row["actor/reused_rollout_log_probs"] == 0.0
    assert 0.0 <= row["training/rollout_log_probs_diff_max"] < 1e-4
    assert row["training/rollout_log_probs_diff_frac_over"] == 0.0
