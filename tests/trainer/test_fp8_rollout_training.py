"""FP8 rollout in the training loop (tiny model, local backend, CPU emulation of the fp8 product):
the mismatch metrics show the fp8 engine's gap every step and the rollout correction acts on it."""

from __future__ import annotations

from trainer_helpers import tiny_config

from rlvr.trainer.main_ppo import run_ppo
from rlvr.trainer.tracking import read_metrics


def test_fp8_rollout_trains_with_the_gap_measured_and_corrected(tiny_model_dir, tiny_data, tmp_path):
    cfg = tiny_config(tiny_model_dir, tiny_data, tmp_path / "run", **{
        "trainer.total_training_steps": 2, "actor_rollout_ref.rollout.quantization": "fp8",
        "algorithm.rollout_correction.rollout_is": "token",
        "algorithm.rollout_correction.rollout_is_threshold": 1.001,
        "algorithm.rollout_correction.rollout_rs": "token",
        "algorithm.rollout_correction.rollout_rs_threshold": 1.001})
    run_ppo(cfg)
    steps = [row for row in read_metrics(tmp_path / "run" / "metrics.jsonl") if "timing_s/step" in row]
    assert len(steps) == 2
    for row in steps:
        assert row["actor/reused_rollout_log_probs"] == 0.0  # the actor recomputes: fp8 log-probs are not its own
        # the HF engine in fp32 reports exactly 0 here (test_rollout_version_and_mismatch.py)
        assert 1e-4 < row["training/rollout_log_probs_diff_max"] < 1.0
        assert 0.0 < row["training/rollout_log_probs_diff_mean"] < row["training/rollout_log_probs_diff_max"]
        assert row["rollout_corr/k3_kl"] > 0.0
        # tight bounds, so the correction visibly acts: weights capped, tokens outside the band dropped
        assert 0.0 < row["rollout_corr/rollout_is_ratio_fraction_high"] < 1.0
        assert row["rollout_corr/rollout_is_mean"] < 1.001
        assert 0.0 < row["rollout_corr/rollout_rs_masked_fraction"] < 1.0
