"""Advantage estimators: hand-computed values (padding, groups of one, all-equal rewards, bf16,
multi-turn gaps), agreement with the independent loop implementation (1e-6, float32), verl 0.9's
positional order and numbers, and the registry's metadata."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import ppo_reference_impl as ref
from ppo_test_data import INDEX, as_lists, make_log_probs, make_mask, make_outcome_rewards
from rlvr.trainer.config import AlgorithmConfig
from rlvr.trainer.ppo.advantage import (
    ADV_ESTIMATOR_REGISTRY,
    AdvantageEstimator,
    compute_gae_advantage_return,
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_grpo_vectorized_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage,
    compute_rloo_vectorized_outcome_advantage,
    get_adv_estimator_fn,
    get_adv_estimator_needs,
    register_adv_est,
)
from rlvr.utils.errors import ConfigError

TOL = dict(rtol=1e-6, atol=1e-6)
SQRT3 = math.sqrt(3.0)


def _call(name, **inputs):
    """The trainer's call: every estimator gets the same keyword arguments."""
    base = dict(token_level_rewards=None, response_mask=None, index=None, values=None, reward_baselines=None,
                old_log_prob=None, old_log_probs=None, rollout_log_prob=None, sum_pi_squared=None,
                rollout_is_weights=None, non_tensor_batch=None, batch=None, config=None)
    base.update(inputs)
    return get_adv_estimator_fn(name)(**base)


def _outcome(scores, lengths, resp_len):
    """Rewards on the last valid token of right-padded responses."""
    rewards, mask = torch.zeros(len(scores), resp_len), torch.zeros(len(scores), resp_len)
    for i, (s, n) in enumerate(zip(scores, lengths)):
        mask[i, :n] = 1
        rewards[i, n - 1] = s
    return rewards, mask


def _random_inputs(seed: int):
    gen = torch.Generator().manual_seed(seed)
    mask = make_mask()
    rewards = make_outcome_rewards(gen, mask)
    rewards += 0.1 * torch.randn(rewards.shape, generator=gen) * mask  # dense rewards for gae / reinforce++
    old_log_prob = make_log_probs(gen)
    return dict(token_level_rewards=rewards, response_mask=mask, index=INDEX,
                values=torch.randn(rewards.shape, generator=gen), reward_baselines=torch.rand(8, generator=gen),
                old_log_prob=old_log_prob, old_log_probs=old_log_prob,
                sum_pi_squared=old_log_prob.exp().square() + 0.1 * torch.rand(rewards.shape, generator=gen))


def _assert_rows(adv, expected_rows, mask):
    expected = torch.tensor(expected_rows, dtype=torch.float32).unsqueeze(-1) * mask
    torch.testing.assert_close(adv, expected, **TOL)


# ----------------------------------------------------------------------------------------- registry
def test_registry_str_enum_duplicates_misses():
    assert {e.value for e in AdvantageEstimator} == {
        "gae", "grpo", "grpo_vectorized", "rloo", "rloo_vectorized", "reinforce_plus_plus",
        "reinforce_plus_plus_baseline", "remax", "opo", "gpg", "egpo", "grpo_passk", "gdpo", "optimal_token_baseline",
        "tir_optimal_token_baseline"}
    for est in AdvantageEstimator:
        assert get_adv_estimator_fn(est) is get_adv_estimator_fn(est.value) is ADV_ESTIMATOR_REGISTRY[est.value]
    with pytest.raises(ValueError, match="already registered"):
        register_adv_est(AdvantageEstimator.GRPO)(lambda **k: None)
    register_adv_est("grpo")(compute_grpo_outcome_advantage)  # the same function again: a no-op
    for error in (KeyError, ValueError):  # verl raises ValueError, a dict KeyError
        with pytest.raises(error, match="egpo, gae, gdpo, gpg, grpo"):
            get_adv_estimator_fn("grpoo")


def test_registry_metadata_says_what_each_estimator_needs():
    needs = {e.value: get_adv_estimator_needs(e) for e in AdvantageEstimator}
    assert {name for name, n in needs.items() if n.needs_critic} == {"gae"}
    assert {name for name, n in needs.items() if n.needs_greedy_baseline} == {"remax"}
    assert {name for name, n in needs.items() if n.needs_groups} == {
        "grpo", "grpo_vectorized", "rloo", "rloo_vectorized", "opo", "gpg", "egpo", "reinforce_plus_plus_baseline",
        "grpo_passk", "gdpo", "optimal_token_baseline", "tir_optimal_token_baseline"}
    assert {name for name, n in needs.items() if n.needs_sum_pi_squared} == {
        "optimal_token_baseline", "tir_optimal_token_baseline"}


def test_user_estimator_metadata_and_dict_behaviour():
    saved = dict(ADV_ESTIMATOR_REGISTRY)
    try:
        @register_adv_est("test_value_baseline", needs_critic=True)
        def value_baseline(token_level_rewards, response_mask, values=None, **kwargs):
            adv = (token_level_rewards.sum(-1, keepdim=True) - values) * response_mask
            return adv, adv

        assert get_adv_estimator_needs("test_value_baseline").needs_critic
        ADV_ESTIMATOR_REGISTRY["test_plain"] = value_baseline  # verl style: plain dict assignment
        assert get_adv_estimator_needs("test_plain") == get_adv_estimator_needs("rloo").__class__()
        ADV_ESTIMATOR_REGISTRY.clear()
        assert "grpo" not in ADV_ESTIMATOR_REGISTRY and len(ADV_ESTIMATOR_REGISTRY) == 0
        register_adv_est("grpo", needs_groups=True)(compute_grpo_outcome_advantage)  # re-register after clear
        assert get_adv_estimator_fn("grpo") is compute_grpo_outcome_advantage
    finally:
        ADV_ESTIMATOR_REGISTRY.clear()
        ADV_ESTIMATOR_REGISTRY.update(saved)
        for name in ("grpo", "test_value_baseline"):
            ADV_ESTIMATOR_REGISTRY.pop(name, None)
        ADV_ESTIMATOR_REGISTRY.add("grpo", compute_grpo_outcome_advantage, needs_groups=True)
    assert get_adv_estimator_needs("grpo").needs_groups


@pytest.mark.parametrize("estimator", list(AdvantageEstimator))
def test_one_calling_convention(estimator):
    inputs = _random_inputs(0)
    if estimator == AdvantageEstimator.GRPO_PASSK:  # pass@k needs two samples in every group
        inputs["index"] = np.array(["p0", "p0", "p0", "p1", "p1", "p2", "p2", "p2"], dtype=object)
    adv, returns = _call(estimator, **inputs, unused_extra="ignored")
    assert adv.shape == returns.shape == (8, 7)
    assert adv.dtype == returns.dtype == torch.float32
    assert torch.isfinite(adv).all()
    assert torch.equal(adv * (1 - inputs["response_mask"]), torch.zeros(8, 7))  # 0 outside the mask


@pytest.mark.parametrize("estimator, missing, message", [
    ("gae", "values", "critic.enable"), ("remax", "reward_baselines", "needs_greedy_baseline"), ("grpo", "index", "uid"),
    ("rloo", "index", "uid"), ("opo", "index", "uid"), ("gpg", "index", "uid"), ("egpo", "old_log_prob", "log-prob"),
])
def test_missing_input_names_the_estimator(estimator, missing, message):
    inputs = _random_inputs(0)
    inputs[missing] = None
    with pytest.raises(ValueError, match=f"'{estimator}' needs.*{message}"):
        _call(estimator, **inputs)


def test_index_length_mismatch():
    inputs = _random_inputs(0)
    inputs["index"] = INDEX[:3]
    with pytest.raises(ValueError, match="index has 3 entries but the batch has 8 rows"):
        _call("grpo", **inputs)


# ----------------------------------------------------------------------------------- hand-computed
def test_grpo_hand_computed_padding_singleton_all_equal():
    # groups: a = [1, 0, 1] (padded lengths 3, 2, 1), b = [0.5] (group of one), c = [1, 1] (all equal)
    rewards, mask = _outcome([1, 0, 1, 0.5, 1, 1], [3, 2, 1, 3, 2, 3], 3)
    index = np.array(["a", "a", "a", "b", "c", "c"], dtype=object)
    adv, returns = _call("grpo", token_level_rewards=rewards, response_mask=mask, index=index)
    # mean 2/3, unbiased std 1/sqrt(3); the group of one: baseline 0, scale 1 (verl)
    _assert_rows(adv, [1 / SQRT3, -2 / SQRT3, 1 / SQRT3, 0.5 / (1 + 1e-6), 0, 0], mask)
    assert torch.equal(adv, returns)
    dr_adv, _ = _call("grpo", token_level_rewards=rewards, response_mask=mask, index=index,
                      config=AlgorithmConfig(norm_adv_by_std_in_grpo=False))
    _assert_rows(dr_adv, [1 / 3, -2 / 3, 1 / 3, 0.5, 0, 0], mask)
    zero_adv, _ = _call("grpo", token_level_rewards=rewards, response_mask=mask, index=index,
                        config=AlgorithmConfig(singleton_advantage="zero"))
    _assert_rows(zero_adv, [1 / SQRT3, -2 / SQRT3, 1 / SQRT3, 0, 0, 0], mask)


def test_grpo_bf16_rewards():
    rewards, mask = _outcome([1, 0, 1], [3, 2, 1], 3)
    adv, _ = _call("grpo", token_level_rewards=rewards.to(torch.bfloat16), response_mask=mask.to(torch.bfloat16),
                   index=np.array(["a"] * 3, dtype=object))
    assert adv.dtype == torch.float32
    _assert_rows(adv, [1 / SQRT3, -2 / SQRT3, 1 / SQRT3], mask)


def test_rloo_hand_computed():
    rewards, mask = _outcome([1, 0, 1, 0.7, 2, 2], [3, 2, 1, 3, 2, 3], 3)
    index = np.array(["a", "a", "a", "b", "c", "c"], dtype=object)
    adv, _ = _call("rloo", token_level_rewards=rewards, response_mask=mask, index=index)
    _assert_rows(adv, [1 - 0.5, 0 - 1, 1 - 0.5, 0.7, 0, 0], mask)  # the group of one: baseline 0 (verl)
    adv, _ = _call("rloo_vectorized", token_level_rewards=rewards, response_mask=mask, index=index)
    _assert_rows(adv, [1 - 0.5, 0 - 1, 1 - 0.5, 0, 0, 0], mask)  # verl's vectorized RLOO masks it
    for name, singleton, lone in [("rloo", "zero", 0.0), ("rloo_vectorized", "score", 0.7)]:
        adv, _ = _call(name, token_level_rewards=rewards, response_mask=mask, index=index,
                       config=AlgorithmConfig(singleton_advantage=singleton))
        _assert_rows(adv, [1 - 0.5, 0 - 1, 1 - 0.5, lone, 0, 0], mask)


def test_opo_hand_computed_length_weighted_baseline():
    rewards, mask = _outcome([1, 0, 0.3], [3, 1, 2], 4)
    index = np.array(["a", "a", "b"], dtype=object)
    adv, _ = _call("opo", token_level_rewards=rewards, response_mask=mask, index=index)
    _assert_rows(adv, [1 - 0.75, 0 - 0.75, 0.3], mask)  # baseline (3*1 + 1*0) / (3 + 1); group of one: 0


def test_gpg_hand_computed_alpha():
    rewards, mask = _outcome([1, 0, 1, 1, 1], [2, 2, 1, 2, 2], 2)
    index = np.array(["a", "a", "b", "c", "c"], dtype=object)
    # verl: alpha = 5 rows / 4 non-zero scores; the group of one (b) has baseline 0
    adv, _ = _call("gpg", token_level_rewards=rewards, response_mask=mask, index=index)
    _assert_rows(adv, [0.625, -0.625, 1.25, 0, 0], mask)
    # the paper's count: the 2 rows of group a carry gradient (c is all-equal, b alone) -> alpha = 5 / 2
    adv, _ = _call("gpg", token_level_rewards=rewards, response_mask=mask, index=index,
                   config=AlgorithmConfig(gpg_alpha_count="informative", singleton_advantage="zero"))
    _assert_rows(adv, [1.25, -1.25, 0, 0, 0], mask)
    with pytest.raises(ConfigError, match="gpg_alpha_count"):
        _call("gpg", token_level_rewards=rewards, response_mask=mask, index=index,
              config=AlgorithmConfig(gpg_alpha_count="all"))


def test_remax_hand_computed():
    rewards = torch.tensor([[0.0, 1.0, 0.0], [0.5, 0.0, 2.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0]])  # row 1: gap, the reward on t=1 is masked
    adv, returns = _call("remax", token_level_rewards=rewards, response_mask=mask,
                         reward_baselines=torch.tensor([0.4, 1.0]))
    torch.testing.assert_close(returns, torch.tensor([[1.0, 1.0, 0.0], [2.5, 0.0, 2.0]]))
    torch.testing.assert_close(adv, torch.tensor([[0.6, 0.6, 0.0], [1.5, 0.0, 1.0]]))


def test_gae_hand_computed_with_multi_turn_gap():
    # gamma 0.9, lam 0.8, V = [0.5, 0.2, 0.1], r = [0, 0, 1]:
    # A2 = 0.9; A1 = -0.11 + 0.72 * 0.9 = 0.538; A0 = -0.32 + 0.72 * 0.538 = 0.06736
    expected_returns = [0.56736, 0.738, 1.0]
    plain_r, plain_v = torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.5, 0.2, 0.1]])
    # same trajectory with a masked tool-output token at t=1 (its value/reward must be ignored)
    gap_r, gap_v = torch.tensor([[0.0, 5.0, 0.0, 1.0]]), torch.tensor([[0.5, 9.0, 0.2, 0.1]])
    gap_mask = torch.tensor([[1.0, 0.0, 1.0, 1.0]])
    config = AlgorithmConfig(gamma=0.9, lam=0.8)
    _, plain_ret = _call("gae", token_level_rewards=plain_r, response_mask=torch.ones(1, 3), values=plain_v,
                         config=config)
    gap_adv, gap_ret = _call("gae", token_level_rewards=gap_r, response_mask=gap_mask, values=gap_v,
                             gamma=0.9, lam=0.8)  # explicit arguments win over the config
    torch.testing.assert_close(plain_ret, torch.tensor([expected_returns]))
    torch.testing.assert_close(gap_ret, torch.tensor([[0.56736, 0.0, 0.738, 1.0]]))
    raw = torch.tensor([0.06736, 0.538, 0.9])
    whitened = (raw - raw.mean()) / torch.sqrt(raw.var() + 1e-8)
    torch.testing.assert_close(gap_adv, torch.tensor([[whitened[0], 0.0, whitened[1], whitened[2]]]))


def test_reinforce_plus_plus_hand_computed_with_gap():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 1.0]])
    adv, returns = _call("reinforce_plus_plus", token_level_rewards=rewards, response_mask=mask,
                         config=AlgorithmConfig(gamma=0.5))
    # row 0: G = [0.25, 0.5, 1]; row 1: the gap is skipped, G_0 = 0.5 * G_2 = 0.5
    torch.testing.assert_close(returns, torch.tensor([[0.25, 0.5, 1.0], [0.5, 0.0, 1.0]]))
    valid = torch.tensor([0.25, 0.5, 1.0, 0.5, 1.0])
    w = (valid - valid.mean()) / torch.sqrt(valid.var() + 1e-8)
    torch.testing.assert_close(adv, torch.tensor([[w[0], w[1], w[2]], [w[3], 0.0, w[4]]]))


def test_reinforce_plus_plus_baseline_hand_computed():
    rewards, mask = _outcome([1, 0, 0.5], [2, 1, 2], 2)
    index = np.array(["a", "a", "b"], dtype=object)
    for singleton, lone in [("score", 0.5), ("zero", 0.0)]:  # the group of one: baseline 0, or itself
        adv, _ = _call("reinforce_plus_plus_baseline", token_level_rewards=rewards, response_mask=mask, index=index,
                       config=AlgorithmConfig(singleton_advantage=singleton))
        valid = torch.tensor([0.5, 0.5, -0.5, lone, lone])  # centred scores on the valid tokens
        w = (valid - valid.mean()) / torch.sqrt(valid.var() + 1e-8)
        torch.testing.assert_close(adv, torch.tensor([[w[0], w[1]], [w[2], 0.0], [w[3], w[4]]]))


# --------------------------------------------------------------------------- reference agreement
@pytest.mark.parametrize("seed, singleton", [(0, "score"), (1, "score"), (2, "zero")])
def test_outcome_estimators_match_reference(seed, singleton):
    inputs = _random_inputs(seed)  # groups of 3, 2, 2 (all equal) and 1
    rewards, mask, values, baselines, log_prob = as_lists(
        inputs["token_level_rewards"], inputs["response_mask"], inputs["values"], inputs["reward_baselines"],
        inputs["old_log_prob"])
    index = list(INDEX)
    config = AlgorithmConfig(singleton_advantage=singleton)
    expected = {
        "grpo": ref.grpo(rewards, mask, index, singleton=singleton),
        "grpo_vectorized": ref.grpo(rewards, mask, index, singleton=singleton),
        "rloo": ref.rloo(rewards, mask, index, singleton=singleton),
        "rloo_vectorized": ref.rloo(rewards, mask, index, singleton=singleton),
        "opo": ref.opo(rewards, mask, index, singleton=singleton),
        "gpg": ref.gpg(rewards, mask, index, singleton=singleton),
        "reinforce_plus_plus_baseline": ref.reinforce_pp_baseline(rewards, mask, index, singleton=singleton),
        "remax": ref.remax(rewards, mask, baselines)[0],
        "egpo": ref.egpo(rewards, mask, index, log_prob, alpha=0.5, beta=0.1, threshold=0.5, singleton=singleton),
    }
    for name, exp in expected.items():
        adv, _ = _call(name, **inputs, config=config)
        torch.testing.assert_close(adv, torch.tensor(exp, dtype=torch.float32), **TOL, msg=name)
    informative, _ = _call("gpg", **inputs, config=AlgorithmConfig(singleton_advantage=singleton,
                                                                    gpg_alpha_count="informative"))
    exp = ref.gpg(rewards, mask, index, alpha_count="informative", singleton=singleton)
    torch.testing.assert_close(informative, torch.tensor(exp, dtype=torch.float32), **TOL)
    dr_adv, _ = _call("grpo", **inputs, config=AlgorithmConfig(norm_adv_by_std_in_grpo=False,
                                                                singleton_advantage=singleton))
    torch.testing.assert_close(dr_adv, torch.tensor(ref.grpo(rewards, mask, index, norm_by_std=False,
                                                             singleton=singleton)), **TOL)
    _, remax_returns = _call("remax", **inputs)
    torch.testing.assert_close(remax_returns, torch.tensor(ref.remax(rewards, mask, baselines)[1]), **TOL)


@pytest.mark.parametrize("gamma, lam", [(1.0, 1.0), (0.99, 0.95), (0.7, 0.3)])
def test_gae_and_reinforce_pp_match_reference(gamma, lam):
    inputs = _random_inputs(3)
    inputs.update(config=AlgorithmConfig(gamma=gamma, lam=lam))
    rewards, mask, values = as_lists(inputs["token_level_rewards"], inputs["response_mask"], inputs["values"])
    adv, returns = _call("gae", **inputs)
    exp_adv, exp_returns = ref.gae(rewards, values, mask, gamma, lam)
    torch.testing.assert_close(adv, torch.tensor(exp_adv, dtype=torch.float32), **TOL)
    torch.testing.assert_close(returns, torch.tensor(exp_returns, dtype=torch.float32), **TOL)
    adv, returns = _call("reinforce_plus_plus", **inputs)
    exp_adv, exp_returns = ref.reinforce_pp(rewards, mask, gamma)
    torch.testing.assert_close(adv, torch.tensor(exp_adv, dtype=torch.float32), **TOL)
    torch.testing.assert_close(returns, torch.tensor(exp_returns, dtype=torch.float32), **TOL)
