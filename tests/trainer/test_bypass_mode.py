"""verl's bypass mode (``algorithm.rollout_correction.bypass_mode``): the rollout's log-probs are the
old policy, the actor is not asked for old log-probs, the rejection band applies to the residual
ratio pi_theta / pi_rollout of each micro-batch, and with ppo_clip the IS weights are statistics only
(the PPO ratio already is that ratio), as in verl."""

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
from rlvr.trainer.ppo.rollout_correction import BYPASS_RS_KEY, bypass_correction, bypass_old_log_probs
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
                "rollout_is_threshold": 2.0, "rollout_is": None, "rollout_is_batch_normalize": False}
    weights, kept, metrics = bypass_correction(current, rollout, mask, settings)
    assert weights is None and metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(2 / 3)
    expected = [int(bool(m) and 1 / 1.5 <= math.exp(c - r) <= 1.5)  # loop reference of the band
                for c, r, m in zip(current[0].tolist(), rollout[0].tolist(), mask[0].tolist())]
    assert kept[0].tolist() == expected == [1, 0, 0, 0]


def test_ppo_clip_bypass_reports_the_is_weights_without_applying_them(tmp_path):
    """verl's rollout_correction example (bypass_mode, loss_type=ppo_clip, rollout_is=token): the
    loss is the plain PPO loss on pi_theta / pi_rollout, and the IS weights are only statistics."""
    from rlvr.utils.testing import save_tiny_model
    from rlvr.workers.actor.dp_actor import DataParallelPPOActor
    from rlvr.workers.models import build_causal_lm

    model = save_tiny_model(tmp_path / "m")
    cfg = load_config(None, [f"actor_rollout_ref.model.path={model}", "algorithm.rollout_correction.bypass_mode=true",
                               "algorithm.rollout_correction.rollout_is=token",
                               "algorithm.rollout_correction.rollout_is_threshold=1.5"])
    validate_config(cfg, require_data_files=False)
    actor = DataParallelPPOActor(cfg.actor_rollout_ref.actor, build_causal_lm(cfg.actor_rollout_ref.model, False),
                                 None, mini_batch_size=2, log_prob_micro_batch_size=2, world_size=1, device="cpu")
    ids = torch.tensor([[1, 5, 6, 7, 8], [1, 9, 10, 11, 12]])
    rollout = torch.tensor([[-5.0, -5.5], [-5.2, -5.8]])
    data = DataProto.from_dict({"input_ids": ids, "attention_mask": torch.ones_like(ids),
                                "position_ids": torch.arange(5).repeat(2, 1), "responses": ids[:, 3:],
                                "response_mask": torch.ones(2, 2), "rollout_log_probs": rollout,
                                "advantages": torch.tensor([[1.0, 1.0], [-1.0, -1.0]])})
    bypass_old_log_probs(data, cfg.algorithm.rollout_correction)
    settings = data.meta_info[BYPASS_RS_KEY]
    micro = {k: data.batch[k] for k in data.batch.keys()}
    loss, values = actor._micro_loss(micro, 1.0, settings)
    log_prob, _ = actor._forward(micro, 1.0, False, False)
    ratio = torch.exp(log_prob - rollout)
    clip = cfg.actor_rollout_ref.actor.clip_ratio
    adv = micro["advantages"]
    expected = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - clip, 1 + clip)).mean()  # no IS weights
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    names = actor.metric_names + sorted(bypass_correction(log_prob, rollout, micro["response_mask"], settings)[2])
    metrics = dict(zip(names, values.tolist(), strict=True))
    truncated = ratio.detach().clamp(max=1.5)
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(truncated.mean().item(), rel=1e-5)


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
        assert 0.0 <= row["rollout_corr/rollout_rs_masked_fraction"] <= 1.0  # the actor's, as verl's loss reports it
