"""DPPO (binary TV / KL), SAPO and DRO: agreement with the independent loop implementation in
algos_reference_impl (1e-6, float32) for every aggregation mode, with and without IS weights,
their metrics, SAPO's gradient, a hand-computed case each, and their config errors."""

from __future__ import annotations

import math

import pytest
import torch

import algos_reference_impl as ref
from ppo_test_data import as_lists, make_log_probs, make_mask
from rlvr.trainer.config import ActorConfig, PolicyLossConfig
from rlvr.trainer.ppo.core_algos import get_policy_loss_fn
from rlvr.trainer.ppo.policy_loss import AGG_LOSS_MODES, POLICY_LOSS_REGISTRY
from rlvr.utils.errors import ConfigError


def _batch(seed: int):
    gen = torch.Generator().manual_seed(seed)
    mask = make_mask(empty_row=True)
    old = make_log_probs(gen)
    new = (old + 0.5 * torch.randn(old.shape, generator=gen)).clamp(max=-1e-3)  # log-probs stay below 0
    adv = torch.randn(old.shape, generator=gen)
    weights = 0.5 + torch.rand(old.shape, generator=gen)
    return old, new, adv, mask, weights


def _close(actual, expected):
    value = actual.item() if isinstance(actual, torch.Tensor) else actual
    assert math.isclose(value, expected, rel_tol=1e-6, abs_tol=1e-6), (value, expected)


@pytest.mark.parametrize("variant", ["tv", "kl"])
@pytest.mark.parametrize("mode", AGG_LOSS_MODES)
@pytest.mark.parametrize("with_weights", [False, True])
def test_dppo_matches_reference(variant, mode, with_weights):
    old, new, adv, mask, weights = _batch(3)
    config = ActorConfig(clip_ratio_low=0.05, clip_ratio_high=0.1, clip_ratio_c=1.3)
    loss, metrics = get_policy_loss_fn(f"dppo_{variant}")(old, new, adv, mask, mode, config,
                                                          weights if with_weights else None)
    expected = ref.dppo(*as_lists(old, new, adv, mask), 0.05, 0.1, 1.3, variant, mode,
                        as_lists(weights)[0] if with_weights else None)
    _close(loss, expected[0])
    for key, value in zip(("pg_clipfrac", "ppo_kl", "pg_clipfrac_lower"), expected[1:]):
        _close(metrics[key], value)
    assert 0 < metrics["pg_clipfrac"].item() < 1  # the data has tokens on both sides of the trust region
    assert metrics["pg_clipfrac_lower"].item() > 0  # and ratios over the cap inside it


def test_dppo_tv_hand_computed():
    """Two tokens, advantage +1: the first moved 0.05 in probability (inside 0.1), the second 0.3
    (outside): only the first counts, with weight min(r, c) = min(0.6/0.55, 3) and no gradient."""
    old = torch.log(torch.tensor([[0.55, 0.2]]))
    new = torch.log(torch.tensor([[0.6, 0.5]])).requires_grad_()
    loss, metrics = get_policy_loss_fn("dppo_tv")(old, new, torch.ones(1, 2), torch.ones(1, 2), "token-sum",
                                                  ActorConfig(clip_ratio=0.1))
    _close(loss, -(0.6 / 0.55) * math.log(0.6))
    _close(metrics["pg_clipfrac"], 0.5)
    loss.backward()
    assert torch.allclose(new.grad, torch.tensor([[-(0.6 / 0.55), 0.0]]))


def test_dppo_kl_never_cuts_a_move_against_the_advantage():
    """A token whose probability fell by a lot under a positive advantage stays in (the binary KL is
    large, but the update did not push it that way)."""
    old, new = torch.log(torch.tensor([[0.9]])), torch.log(torch.tensor([[0.05]]))
    _, metrics = get_policy_loss_fn("dppo_kl")(old, new, torch.ones(1, 1), torch.ones(1, 1), "token-mean",
                                               ActorConfig(clip_ratio=0.01))
    assert metrics["pg_clipfrac"].item() == 0.0
    _, metrics = get_policy_loss_fn("dppo_tv")(old, new, torch.ones(1, 1), torch.ones(1, 1), "token-mean",
                                               ActorConfig(clip_ratio=0.01))
    assert metrics["pg_clipfrac"].item() == 0.0  # TV bounds only the rise under a positive advantage


@pytest.mark.parametrize("with_weights", [False, True])
def test_sapo_matches_reference_whatever_the_agg_mode(with_weights):
    old, new, adv, mask, weights = _batch(5)
    config = ActorConfig(tau_pos=1.0, tau_neg=1.05)
    expected, grads = ref.sapo(*as_lists(old, new, adv, mask), 1.0, 1.05, as_lists(weights)[0] if with_weights else None)
    for mode in ("token-mean", "seq-mean-token-sum"):  # SAPO aggregates per sequence whatever it is given
        leaf = new.clone().requires_grad_()
        loss, metrics = get_policy_loss_fn("sapo")(old, leaf, adv, mask, mode, config,
                                                   weights if with_weights else None)
        _close(loss, expected)
        assert metrics["pg_clipfrac"].item() == 0.0
        loss.backward()
        lengths = mask.sum(-1)
        rows = int((lengths > 0).sum())
        for i in range(mask.shape[0]):
            for t in range(mask.shape[1]):
                want = grads[i][t] / lengths[i].item() / rows if mask[i, t] else 0.0
                assert math.isclose(leaf.grad[i, t].item(), want, rel_tol=1e-5, abs_tol=1e-6)


def test_sapo_gate_is_the_policy_gradient_on_policy():
    """At r = 1 the gate is 2 / tau and its gradient 1 per unit advantage (sigmoid'(0) * 4 = 1)."""
    lp = torch.log(torch.tensor([[0.3, 0.4]])).requires_grad_()
    loss, _ = get_policy_loss_fn("sapo")(lp.detach(), lp, torch.tensor([[1.0, -2.0]]), torch.ones(1, 2),
                                         config=ActorConfig(tau_pos=2.0, tau_neg=4.0))
    _close(loss, (-(2 / 2.0) * 1.0 + -(2 / 4.0) * -2.0) / 2)
    loss.backward()
    assert torch.allclose(lp.grad, torch.tensor([[-0.5, 1.0]]))


def test_sapo_refuses_a_non_positive_temperature():
    with pytest.raises(ConfigError, match="tau_neg"):
        get_policy_loss_fn("sapo")(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1),
                                   config=ActorConfig(tau_neg=0.0))


@pytest.mark.parametrize("mode", AGG_LOSS_MODES)
def test_dro_matches_reference(mode):
    old, new, adv, mask, weights = _batch(7)
    config = ActorConfig(policy_loss=PolicyLossConfig(loss_mode="dro", dro_beta=0.3))
    loss, metrics = get_policy_loss_fn("dro")(old, new, adv, mask, mode, config)
    expected_loss, expected_kl = ref.dro(*as_lists(old, new, adv, mask), 0.3, mode)
    _close(loss, expected_loss)
    _close(metrics["ppo_kl"], expected_kl)


def test_dro_hand_computed_and_gradient():
    """loss = -(A logp - beta/2 (logp - old)^2), d/dlogp = -(A - beta (logp - old))."""
    old = torch.tensor([[-1.0]])
    new = torch.tensor([[-0.5]], requires_grad=True)
    config = ActorConfig(policy_loss=PolicyLossConfig(dro_beta=2.0))
    loss, _ = get_policy_loss_fn("dro")(old, new, torch.tensor([[3.0]]), torch.ones(1, 1), "token-mean", config)
    _close(loss, -(3.0 * -0.5 - 0.5 * 2.0 * 0.25))
    loss.backward()
    _close(new.grad[0, 0], -(3.0 - 2.0 * 0.5))


@pytest.mark.parametrize("beta", [None, 0.0, -1.0])
def test_dro_needs_a_positive_beta(beta):
    config = ActorConfig(policy_loss=PolicyLossConfig(dro_beta=beta))
    with pytest.raises(ConfigError, match="dro_beta"):
        get_policy_loss_fn("dro")(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1),
                                  config=config)


def test_verl_config_objects_work():
    """verl's ActorConfig carries the same keys: a plain dict with verl's keys gives the same numbers."""
    old, new, adv, mask, _ = _batch(9)
    verl_like = {"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 3.0,
                 "tau_pos": 1.0, "tau_neg": 1.05, "policy_loss": {"dro_beta": 0.1}, "global_batch_info": {}}
    for name in ("dppo_tv", "dppo_kl", "sapo", "dro"):
        ours = get_policy_loss_fn(name)(old, new, adv, mask, "token-mean",
                                        ActorConfig(policy_loss=PolicyLossConfig(dro_beta=0.1)))[0]
        assert torch.equal(get_policy_loss_fn(name)(old, new, adv, mask, "token-mean", verl_like)[0], ours)


def test_registered_under_verls_names():
    assert {"dppo_tv", "dppo_kl", "sapo", "dro", "bypass_mode"} <= set(POLICY_LOSS_REGISTRY)
