"""verl's bypass mode (``algorithm.rollout_correction.bypass_mode``): the rollout's log-probs are the
old policy, the actor is not asked for old log-probs, the rejection band applies to the residual
ratio pi_theta / pi_rollout of each micro-batch, and IS weights are refused (they would count the
PPO ratio twice)."""

from __future__ import annotations

import math

import pytest
import torch
from omegaconf import OmegaConf
from trainer_helpers import tiny_config

from rlvr.protocol import DataProto
from rlvr.trainer.config import load_config, validate_config
from rlvr.trainer.config.schema import RolloutCorrectionConfig
from rlvr.trainer.main_ppo import run_ppo
from rlvr.trainer.ppo.rollout_correction import BYPASS_RS_KEY, bypass_old_log_probs, compute_bypass_rejection
from rlvr.trainer.tracking import read_metrics
from rlvr.utils.errors import ConfigError


def test_bypass_sets_old_log_probs_to_the_rollouts_and_passes_the_band():
    rollout = torch.tensor([[-0.5, -1.0, 0.0], [-2.0, -0.1, -0.3]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    batch = DataProto.from_dict(tensors={"rollout_log_probs": rollout, "response_mask": mask})
    rc = OmegaConf.structured(RolloutCorrectionConfig(bypass_mode=True, rollout_rs="token", rollout_rs_threshold=1.5))
    metrics = bypass_old_log_probs(batch, rc)
    assert torch.equal(batch.batch["old_log_probs"], rollout) and batch.batch["old_log_probs"] is not rollout
    assert metrics["actor/bypass_mode"] == 1.0
    assert metrics["actor/entropy"] == pytest.approx((0.5 + 1.0 + 2.0 + 0.1 + 0.3) / 5)
    assert batch.meta_info[BYPASS_RS_KEY] == {"loss_type": "ppo_clip", "rollout_is": None, "rollout_is_threshold": 2.0,
                                              "rollout_is_batch_normalize": False, "rollout_rs": "token",
                                              "rollout_rs_threshold": 1.5, "rollout_rs_threshold_lower": None}


def test_bypass_rejection_drops_tokens_whose_residual_leaves_the_band():
    rollout = torch.tensor([[-1.0, -1.0, -1.0, -1.0]])
    current = torch.tensor([[-1.0, -0.5, -1.6, -1.2]], requires_grad=True)  # ratios 1, e^0.5, e^-0.6, e^-0.2
    mask = torch.tensor([[1, 1, 1, 0]])
    settings = {"rollout_rs": "token", "rollout_rs_threshold": 1.5, "rollout_rs_threshold_lower": None,
                "rollout_is_threshold": 2.0}
    kept = compute_bypass_rejection(current, rollout, mask, settings)
    expected = [int(bool(m) and 1 / 1.5 <= math.exp(c - r) <= 1.5)  # loop reference of the band
                for c, r, m in zip(current[0].tolist(), rollout[0].tolist(), mask[0].tolist())]
    assert kept[0].tolist() == expected == [1, 0, 0, 0]


def test_is_weights_with_bypass_are_refused():
    cfg = load_config("grpo", ["algorithm.rollout_correction.bypass_mode=true",
                               "algorithm.rollout_correction.rollout_is=token"])
    with pytest.raises(ConfigError, match="rollout_correction.rollout_is.*count that gap twice"):
        validate_config(cfg, require_data_files=False)


def test_bypass_mode_skips_the_old_log_prob_pass(tiny_model_dir, tiny_data, tmp_path):
    cfg = tiny_config(tiny_model_dir, tiny_data, tmp_path / "run", **{
        "trainer.total_training_steps": 2, "algorithm.rollout_correction.bypass_mode": True,
        "algorithm.rollout_correction.rollout_rs": "token", "algorithm.rollout_correction.rollout_rs_threshold": 2.0})
    run_ppo(cfg)
    steps = [row for row in read_metrics(tmp_path / "run" / "metrics.jsonl") if "timing_s/step" in row]
    assert len(steps) == 2
    for row in steps:
        assert row["actor/bypass_mode"] == 1.0
        assert "timing_s/old_log_prob" not in row and "actor/reused_rollout_log_probs" not in row
        assert row["actor/pg_clipfrac"] >= 0.0
