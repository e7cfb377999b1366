"""GDPO and GRPO pass@k: agreement with the loop references (1e-6, float32), hand-computed values,
the trainer's calling convention, and the errors of missing reward keys and lone samples."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import algos_reference_impl as ref
from ppo_test_data import INDEX, as_lists, make_mask, make_outcome_rewards
from rlvr.trainer.config import AlgorithmConfig
from rlvr.trainer.ppo.core_algos import (
    compute_gdpo_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    get_adv_estimator_fn,
)
from rlvr.utils.errors import ConfigError
from rlvr.utils.torch_functional import masked_whiten

TOL = dict(rtol=1e-6, atol=1e-6)
PAIRS = np.array(["a", "a", "a", "b", "b", "c", "c", "c"], dtype=object)  # no group of one (pass@k needs two)


def _keys(seed: int, rows: int = 8):
    gen = np.random.default_rng(seed)
    return {"format_reward": gen.integers(0, 2, rows).astype(float).tolist(),
            "accuracy_reward": (gen.random(rows) * 4).round(1).tolist()}


@pytest.mark.parametrize("weights", [None, [1.0, 0.5]])
@pytest.mark.parametrize("norm", [True, False])
def test_gdpo_matches_reference(weights, norm):
    mask = make_mask()
    keys = _keys(1)
    config = AlgorithmConfig(gdpo_reward_keys=["format_reward", "accuracy_reward"], gdpo_reward_weights=weights,
                             norm_adv_by_std_in_grpo=norm)
    non_tensor = {**{k: np.array(v, dtype=object) for k, v in keys.items()}, "uid": INDEX}
    adv, returns = get_adv_estimator_fn("gdpo")(token_level_rewards=torch.zeros(8, 7), response_mask=mask,
                                                index=INDEX, config=config, non_tensor_batch=non_tensor, batch={})
    expected = ref.gdpo([keys["format_reward"], keys["accuracy_reward"]], weights or [1.0, 1.0], INDEX.tolist(),
                        as_lists(mask)[0], norm_by_std=norm)
    torch.testing.assert_close(adv, torch.tensor(expected, dtype=torch.float32), **TOL)
    assert torch.equal(adv, returns)


def test_gdpo_hand_computed():
    """Groups p: (f, a) = (1, 0), (0, 0) and q: (0, 2), (0, 0). Per key and group the GRPO advantage
    of two different values is +-1/sqrt(2) (half the difference d over the std d / sqrt(2)) and 0 for
    equal ones, so the sums are c * (+1, -1, +1, -1); whitened over 4 x 3 tokens (unbiased variance
    12 c^2 / 11): +-sqrt(11/12)."""
    mask = torch.ones(4, 3)
    config = AlgorithmConfig(gdpo_reward_keys=["f", "a"])
    non_tensor = {"f": np.array([1.0, 0.0, 0.0, 0.0]), "a": np.array([0.0, 0.0, 2.0, 0.0])}
    adv, _ = compute_gdpo_outcome_advantage(torch.zeros(4, 3), mask, np.array(["p", "p", "q", "q"]), config=config,
                                            non_tensor_batch=non_tensor, batch={})
    root = math.sqrt(11 / 12)
    assert torch.allclose(adv[:, 0], torch.tensor([root, -root, root, -root]), atol=1e-5)
    # a weight scales a key's share before the whitening: format counted 3 times, accuracy once
    config = AlgorithmConfig(gdpo_reward_keys=["f", "a"], gdpo_reward_weights=[3.0, 1.0])
    adv, _ = compute_gdpo_outcome_advantage(torch.zeros(4, 3), mask, np.array(["p", "p", "q", "q"]), config=config,
                                            non_tensor_batch=non_tensor, batch={})
    spread = math.sqrt((2 * 9 + 2 * 1) * 3 / 11)
    assert torch.allclose(adv[:, 0], torch.tensor([3, -3, 1, -1]) / spread, atol=1e-5)


def test_gdpo_without_its_inputs_is_whitened_grpo():
    """verl's fallback: without config, non_tensor_batch and batch, the one dimension is the summed reward."""
    gen = torch.Generator().manual_seed(4)
    mask = make_mask()
    rewards = make_outcome_rewards(gen, mask)
    adv, _ = compute_gdpo_outcome_advantage(rewards, mask, INDEX)
    grpo, _ = compute_grpo_outcome_advantage(rewards, mask, INDEX)
    torch.testing.assert_close(adv, masked_whiten(grpo, mask) * mask, **TOL)


def test_gdpo_errors_name_the_key():
    mask = torch.ones(2, 2)
    with pytest.raises(ConfigError, match="gdpo_reward_keys"):
        compute_gdpo_outcome_advantage(torch.zeros(2, 2), mask, np.array(["p", "p"]), config=AlgorithmConfig(),
                                       non_tensor_batch={}, batch={})
    with pytest.raises(ValueError, match="'acc'.*compute_score return a dict"):
        compute_gdpo_outcome_advantage(torch.zeros(2, 2), mask, np.array(["p", "p"]),
                                       config=AlgorithmConfig(gdpo_reward_keys=["acc"]), non_tensor_batch={"x": [1, 2]},
                                       batch={})
    with pytest.raises(ConfigError, match="one weight per key"):
        compute_gdpo_outcome_advantage(torch.zeros(2, 2), mask, np.array(["p", "p"]),
                                       config=AlgorithmConfig(gdpo_reward_keys=["x"], gdpo_reward_weights=[1.0, 2.0]),
                                       non_tensor_batch={"x": [1.0, 2.0]}, batch={})


@pytest.mark.parametrize("norm", [True, False])
def test_grpo_passk_matches_reference(norm):
    mask = make_mask()
    scores = [0.3, 0.9, 0.1, 0.5, 0.5, 0.2, 1.5, 0.7]  # group b is a tie: no one learns there
    rewards = torch.zeros(8, 7)
    for i, s in enumerate(scores):
        rewards[i, int(mask[i].nonzero().max())] = s
    adv, returns = compute_grpo_passk_outcome_advantage(rewards, mask, PAIRS,
                                                        config=AlgorithmConfig(norm_adv_by_std_in_grpo=norm))
    expected = ref.grpo_passk(scores, PAIRS.tolist(), as_lists(mask)[0], norm_by_std=norm)
    torch.testing.assert_close(adv, torch.tensor(expected, dtype=torch.float32), **TOL)
    assert torch.equal(adv, returns)
    assert (adv.abs().sum(-1) > 0).tolist() == [False, True, False, False, False, False, True, False]


def test_grpo_passk_hand_computed():
    adv, _ = compute_grpo_passk_outcome_advantage(torch.tensor([[1.0], [0.0], [0.5]]), torch.ones(3, 1),
                                                  np.array(["p", "p", "p"]))
    std = math.sqrt(((1 - 0.5) ** 2 + 0.5 ** 2 + 0) / 2)
    assert torch.allclose(adv[:, 0], torch.tensor([0.5 / (std + 1e-6), 0.0, 0.0]))


def test_grpo_passk_refuses_a_lone_sample():
    with pytest.raises(ValueError, match="at least 2 samples per group; prompt 'q'"):
        compute_grpo_passk_outcome_advantage(torch.ones(3, 1), torch.ones(3, 1), np.array(["p", "p", "q"]))
