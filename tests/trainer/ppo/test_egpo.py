"""EGPO: hand-computed values for every branch of the calibration (rlvr.trainer.ppo.egpo)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rlvr.trainer.config import AlgorithmConfig
from rlvr.trainer.ppo.advantage import compute_egpo_outcome_advantage
from rlvr.utils.errors import ConfigError
from rlvr.trainer.ppo.egpo import entropy_proxy

TOL = dict(rtol=1e-5, atol=1e-6)


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def _batch():
    """Rows 0-2: informative group [1, 0, 0]; rows 3-4 all wrong; rows 5-6 all correct; row 7 alone.

    The uncertainty proxy is the mean -log-prob over the mask: row 1 has a masked gap whose
    log-prob (-99) must be ignored.
    """
    mask = torch.ones(8, 2)
    mask[1, 1] = 0
    log_prob = torch.tensor([[-0.5, -0.5], [-0.2, -99.0], [-1.4, -1.4], [-0.1, -0.1], [-0.3, -0.3],
                             [-0.1, -0.1], [-0.3, -0.3], [-2.0, -2.0]])
    scores = [1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    rewards = torch.zeros(8, 2)
    for i, s in enumerate(scores):
        rewards[i, int(mask[i].sum()) - 1] = s
    index = np.array(["a", "a", "a", "w", "w", "c", "c", "s"], dtype=object)
    return rewards, mask, log_prob, index


def test_entropy_proxy_ignores_masked_tokens_and_empty_rows():
    log_prob = torch.tensor([[-0.2, -99.0], [-1.0, -3.0], [-5.0, -5.0]], dtype=torch.bfloat16)
    mask = torch.tensor([[1, 0], [1, 1], [0, 0]])
    torch.testing.assert_close(entropy_proxy(log_prob, mask), torch.tensor([0.2, 2.0, 0.0]), rtol=1e-2, atol=1e-3)
    assert entropy_proxy(log_prob, mask).dtype == torch.float32


def test_egpo_every_branch_hand_computed():
    rewards, mask, log_prob, index = _batch()
    adv, returns = compute_egpo_outcome_advantage(token_level_rewards=rewards, response_mask=mask, index=index,
                                                  old_log_prob=log_prob, config=AlgorithmConfig())
    # informative group: u = [0.5, 0.2, 1.4], mean 0.7, unbiased std sqrt(0.39)
    std = math.sqrt(0.39)
    conf = [_sigmoid(-(u - 0.7) / (std + 1e-6)) for u in (0.5, 0.2, 1.4)]
    assert conf[1] == pytest.approx(0.6901, abs=1e-4) and conf[2] == pytest.approx(0.2458, abs=1e-4)
    grpo = [2 / 3 * math.sqrt(3), -1 / 3 * math.sqrt(3), -1 / 3 * math.sqrt(3)]  # mean 1/3, std 1/sqrt(3)
    expected = [
        grpo[0],                                   # correct: unchanged (1.1547)
        grpo[1] * (1 + 0.5 * (2 * conf[1] - 1)),   # confident failure: pushed harder (-0.6871)
        grpo[2] * (1 + 0.5 * (2 * conf[2] - 1)),   # uncertain failure: pushed softer (-0.4306)
    ]
    assert expected[1] == pytest.approx(-0.6871, abs=1e-4) and expected[2] == pytest.approx(-0.4306, abs=1e-4)
    # all-wrong group: u = [0.1, 0.3] -> z = -/+ 0.1 / (0.1 * sqrt(2)), c = [0.6698, 0.3302]; -beta * c
    c_low_u, c_high_u = _sigmoid(1 / math.sqrt(2)), _sigmoid(-1 / math.sqrt(2))
    expected += [-0.1 * c_low_u, -0.1 * c_high_u]
    # all-correct group, same uncertainties: +beta * (1 - c)
    expected += [0.1 * (1 - c_low_u), 0.1 * (1 - c_high_u)]
    expected += [1 / (1 + 1e-6)]  # group of one: its GRPO advantage (baseline 0), confidence 0.5
    assert expected[3] == pytest.approx(-0.06698, abs=1e-5) and expected[6] == pytest.approx(0.06698, abs=1e-5)
    torch.testing.assert_close(adv, torch.tensor(expected).unsqueeze(-1) * mask, **TOL)
    assert torch.equal(adv, returns)
    adv, _ = compute_egpo_outcome_advantage(token_level_rewards=rewards, response_mask=mask, index=index,
                                            old_log_prob=log_prob, config=AlgorithmConfig(singleton_advantage="zero"))
    torch.testing.assert_close(adv, torch.tensor(expected[:7] + [0.0]).unsqueeze(-1) * mask, **TOL)


def test_egpo_alpha_zero_is_grpo_on_informative_groups_and_equal_logprobs_give_half_confidence():
    rewards, mask, log_prob, index = _batch()
    log_prob = torch.full_like(log_prob, -0.7)  # all equally confident: c = 0.5 everywhere
    adv, _ = compute_egpo_outcome_advantage(token_level_rewards=rewards, response_mask=mask, index=index,
                                            old_log_prob=log_prob, config=AlgorithmConfig(egpo_alpha=0.0))
    s3 = math.sqrt(3)
    expected = [2 / 3 * s3, -1 / 3 * s3, -1 / 3 * s3, -0.05, -0.05, 0.05, 0.05, 1 / (1 + 1e-6)]
    torch.testing.assert_close(adv, torch.tensor(expected).unsqueeze(-1) * mask, **TOL)


def test_egpo_batch_normalisation_and_rollout_log_prob_fallback():
    rewards, mask, log_prob, index = _batch()
    config = AlgorithmConfig(egpo_uncertainty_norm="batch", egpo_beta=0.2, egpo_correct_threshold=0.9)
    adv, _ = compute_egpo_outcome_advantage(token_level_rewards=rewards, response_mask=mask, index=index,
                                            rollout_log_prob=log_prob, config=config)
    u = [0.5, 0.2, 1.4, 0.1, 0.3, 0.1, 0.3, 2.0]
    mean = sum(u) / 8
    std = math.sqrt(sum((x - mean) ** 2 for x in u) / 7)
    c = [_sigmoid(-(x - mean) / (std + 1e-6)) for x in u]
    s3 = math.sqrt(3)
    expected = [2 / 3 * s3, -1 / 3 * s3 * (1 + 0.5 * (2 * c[1] - 1)), -1 / 3 * s3 * (1 + 0.5 * (2 * c[2] - 1)),
                -0.2 * c[3], -0.2 * c[4], 0.2 * (1 - c[5]), 0.2 * (1 - c[6]), 1 / (1 + 1e-6)]
    torch.testing.assert_close(adv, torch.tensor(expected).unsqueeze(-1) * mask, **TOL)


def test_egpo_dr_grpo_base_and_bf16():
    rewards, mask, log_prob, index = _batch()
    adv, _ = compute_egpo_outcome_advantage(
        token_level_rewards=rewards.to(torch.bfloat16), response_mask=mask, index=index,
        old_log_prob=torch.full_like(log_prob, -0.7).to(torch.bfloat16),
        config=AlgorithmConfig(norm_adv_by_std_in_grpo=False, egpo_alpha=0.0))
    assert adv.dtype == torch.float32
    expected = [2 / 3, -1 / 3, -1 / 3, -0.05, -0.05, 0.05, 0.05, 1.0]
    torch.testing.assert_close(adv, torch.tensor(expected).unsqueeze(-1) * mask, **TOL)


def test_egpo_rejects_bad_settings():
    rewards, mask, log_prob, index = _batch()
    with pytest.raises(ConfigError, match="egpo_alpha.*must be in"):
        compute_egpo_outcome_advantage(token_level_rewards=rewards, response_mask=mask, index=index,
                                       old_log_prob=log_prob, config=AlgorithmConfig(egpo_alpha=1.5))
    with pytest.raises(ValueError, match="egpo_uncertainty_norm"):
        compute_egpo_outcome_advantage(token_level_rewards=rewards, response_mask=mask, index=index,
                                       old_log_prob=log_prob, config=AlgorithmConfig(egpo_uncertainty_norm="token"))
    with pytest.raises(ValueError, match="'egpo' needs old_log_prob or rollout_log_prob"):
        compute_egpo_outcome_advantage(token_level_rewards=rewards, response_mask=mask, index=index)
