"""The optimal token baseline (column-aligned and valid-token-aligned): agreement with the loop
references (1e-6, float32) with and without IS weights and the zero tail, a hand-computed group,
both alignments agreeing on contiguous masks, and the errors of missing inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import algos_reference_impl as ref
from ppo_test_data import INDEX, as_lists, make_mask
from rlvr.trainer.ppo.core_algos import (
    compute_multi_turn_optimal_token_baseline_advantage,
    compute_optimal_token_baseline_advantage,
    get_adv_estimator_fn,
    get_adv_estimator_needs,
)
from rlvr.utils.torch_functional import calculate_sum_pi_squared_from_logits

TOL = dict(rtol=1e-6, atol=1e-6)


def _policy_outputs(seed: int, rows: int, width: int):
    """``(old_log_probs, sum_pi_squared)`` of sampled tokens under random 6-token distributions."""
    gen = torch.Generator().manual_seed(seed)
    logits = 2 * torch.randn(rows, width, 6, generator=gen)
    tokens = torch.multinomial(logits.softmax(-1).view(-1, 6), 1, generator=gen).view(rows, width)
    log_probs = logits.log_softmax(-1).gather(-1, tokens[..., None]).squeeze(-1)
    return log_probs, calculate_sum_pi_squared_from_logits(logits)


def _inputs(seed: int, mask: torch.Tensor, dense: bool = True):
    gen = torch.Generator().manual_seed(seed + 100)
    rewards = torch.zeros(mask.shape)
    for i, row in enumerate(mask):
        if row.any():
            rewards[i, int(row.nonzero().max())] = torch.rand((), generator=gen) * 2 - 0.5
    if dense:
        rewards += 0.2 * torch.randn(mask.shape, generator=gen) * mask
    old, spsq = _policy_outputs(seed, *mask.shape)
    weights = 0.5 + torch.rand(mask.shape, generator=gen)
    return rewards, old, spsq, weights


@pytest.mark.parametrize("zero_tail", [True, False])
@pytest.mark.parametrize("with_weights", [False, True])
def test_optimal_token_baseline_matches_reference(zero_tail, with_weights):
    mask = make_mask(empty_row=True)
    rewards, old, spsq, weights = _inputs(1, mask)
    is_weights = weights if with_weights else None
    adv, returns = compute_optimal_token_baseline_advantage(rewards, mask, INDEX, old, spsq, is_weights, zero_tail)
    expected_adv, expected_returns = ref.optimal_token_baseline(
        *as_lists(rewards, mask), INDEX.tolist(), *as_lists(old, spsq), as_lists(weights)[0] if with_weights else None,
        zero_tail)
    torch.testing.assert_close(adv, torch.tensor(expected_adv, dtype=torch.float32), **TOL)
    torch.testing.assert_close(returns, torch.tensor(expected_returns, dtype=torch.float32), **TOL)


@pytest.mark.parametrize("zero_tail", [True, False])
@pytest.mark.parametrize("with_weights", [False, True])
def test_tir_optimal_token_baseline_matches_reference(zero_tail, with_weights):
    mask = make_mask(empty_row=True)  # rows 2 and 6 have tool-output gaps, row 3 is empty
    rewards, old, spsq, weights = _inputs(2, mask)
    is_weights = weights if with_weights else None
    adv, _ = compute_multi_turn_optimal_token_baseline_advantage(rewards, mask, INDEX, old, spsq, is_weights,
                                                                 zero_tail)
    expected = ref.tir_optimal_token_baseline(*as_lists(rewards, mask), INDEX.tolist(), *as_lists(old, spsq),
                                              as_lists(weights)[0] if with_weights else None, zero_tail)
    torch.testing.assert_close(adv, torch.tensor(expected, dtype=torch.float32), **TOL)


def test_both_alignments_agree_on_contiguous_responses():
    mask = torch.ones(6, 5)
    for i, length in enumerate([5, 3, 4, 2, 5, 1]):
        mask[i, length:] = 0
    index = np.array(["a", "a", "a", "b", "b", "b"], dtype=object)
    rewards, old, spsq, _ = _inputs(3, mask)
    one, _ = compute_optimal_token_baseline_advantage(rewards, mask, index, old, spsq)
    two, _ = compute_multi_turn_optimal_token_baseline_advantage(rewards, mask, index, old, spsq)
    torch.testing.assert_close(one, two, **TOL)


def test_hand_computed_group():
    """Two one-token responses with rewards 1 and 0 and energies w = 1 - 2p + s of 0.5 and 1.5:
    B = (1 * 0.5 + 0 * 1.5) / 2 = 0.25, so A = (0.75, -0.25) (the low-energy path weighs less)."""
    p = torch.tensor([[0.5], [0.25]])
    spsq = 0.5 - 1 + 2 * p  # w = 0.5 for the first; the second: 1 - 0.5 + s = 1.5 -> s = 1.0
    spsq[1, 0] = 1.0
    adv, returns = compute_optimal_token_baseline_advantage(torch.tensor([[1.0], [0.0]]), torch.ones(2, 1),
                                                            np.array(["g", "g"]), p.log(), spsq)
    assert torch.allclose(adv, torch.tensor([[0.75], [-0.25]]), atol=1e-6)
    assert torch.equal(returns, torch.tensor([[1.0], [0.0]]))


def test_zero_tail_of_the_longest_response():
    """Past the second longest response only the longest has tokens: its baseline there would be its
    own return (advantage 0); the zero tail gives it baseline 0 instead (advantage = its return)."""
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    rewards = torch.tensor([[0.0, 0.0, 2.0], [1.0, 0.0, 0.0]])
    old, spsq = _policy_outputs(4, 2, 3)
    index = np.array(["g", "g"])
    kept, _ = compute_optimal_token_baseline_advantage(rewards, mask, index, old, spsq, handle_zero_tail=False)
    cut, _ = compute_optimal_token_baseline_advantage(rewards, mask, index, old, spsq)
    assert torch.allclose(kept[0, 1:], torch.zeros(2), atol=1e-6)
    assert torch.allclose(cut[0, 1:], torch.tensor([2.0, 2.0]))
    assert torch.equal(kept[:, 0], cut[:, 0])


def test_group_of_one_keeps_its_return_and_registry_needs():
    rewards, old, spsq, _ = _inputs(5, torch.ones(1, 3))
    adv, returns = get_adv_estimator_fn("optimal_token_baseline")(
        token_level_rewards=rewards, response_mask=torch.ones(1, 3), index=np.array(["x"]), old_log_probs=old,
        old_log_prob=old, sum_pi_squared=spsq, rollout_is_weights=None, values=None, config=None)
    assert torch.equal(adv, returns)
    for name in ("optimal_token_baseline", "tir_optimal_token_baseline"):
        needs = get_adv_estimator_needs(name)
        assert needs.needs_sum_pi_squared and needs.reads_old_log_prob and needs.needs_groups


def test_missing_sum_pi_squared_says_which_key_to_set():
    with pytest.raises(ValueError, match="calculate_sum_pi_squared=true"):
        compute_optimal_token_baseline_advantage(torch.ones(2, 2), torch.ones(2, 2), np.array(["g", "g"]),
                                                 torch.zeros(2, 2), None)


def test_sum_pi_squared_from_logits():
    logits = torch.tensor([[0.0, math.log(3.0)]])  # probabilities 1/4, 3/4
    assert torch.allclose(calculate_sum_pi_squared_from_logits(logits), torch.tensor([1 / 16 + 9 / 16]))
