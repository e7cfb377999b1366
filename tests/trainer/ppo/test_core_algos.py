"""rlvr.trainer.ppo.core_algos: verl's names and signatures, kl_penalty, the clipped value loss
and the KL controllers (hand-computed values and agreement with ppo_reference_impl)."""

from __future__ import annotations

import inspect
import math

import pytest
import torch

import ppo_reference_impl as ref
from ppo_test_data import as_lists, make_log_probs, make_mask
from rlvr.trainer.ppo import core_algos
from rlvr.trainer.config import KLControlConfig
from rlvr.trainer.ppo.core_algos import (
    AdaptiveKLController,
    FixedKLController,
    compute_value_loss,
    entropy_from_logits,
    get_kl_controller,
    kl_penalty,
)
from rlvr.trainer.ppo.kl import KL_PENALTY_NAMES
from rlvr.utils.errors import ConfigError

TOL = dict(rtol=1e-6, atol=1e-6)


def test_verl_names_and_signatures():
    params = lambda fn: list(inspect.signature(fn).parameters)  # noqa: E731
    assert params(core_algos.agg_loss)[:3] == ["loss_mat", "loss_mask", "loss_agg_mode"]
    assert params(core_algos.compute_policy_loss) == [
        "old_log_prob", "log_prob", "advantages", "response_mask", "cliprange", "cliprange_low",
        "cliprange_high", "clip_ratio_c", "loss_agg_mode"]
    assert inspect.signature(core_algos.compute_policy_loss).parameters["clip_ratio_c"].default == 3.0
    assert params(core_algos.kl_penalty) == ["logprob", "ref_logprob", "kl_penalty"]
    for name in core_algos.__all__:
        assert getattr(core_algos, name) is not None


# --------------------------------------------------------------------------------------- kl_penalty
def test_kl_penalty_hand_computed():
    lp, rp = torch.tensor([[-1.0, -2.0, -30.0]]), torch.tensor([[-2.0, -1.0, 0.0]])
    torch.testing.assert_close(kl_penalty(lp, rp, "kl"), torch.tensor([[1.0, -1.0, -30.0]]))
    torch.testing.assert_close(kl_penalty(lp, rp, "abs"), torch.tensor([[1.0, 1.0, 30.0]]))
    torch.testing.assert_close(kl_penalty(lp, rp, "mse"), torch.tensor([[0.5, 0.5, 450.0]]))
    # k3 = exp(ref - lp) - (ref - lp) - 1; the last token: exp(20) - 21 clamped to 10
    torch.testing.assert_close(kl_penalty(lp, rp, "low_var_kl"), torch.tensor([[math.exp(-1), math.e - 2, 10.0]]))


@pytest.mark.parametrize("name", [n for n in KL_PENALTY_NAMES if n != "full" and not n.endswith("+")])
def test_kl_penalty_matches_reference(name):
    gen = torch.Generator().manual_seed(11)
    lp, rp = make_log_probs(gen), make_log_probs(gen)
    expected = [[ref.kl(a, b, name) for a, b in zip(ra, rb)] for ra, rb in zip(*as_lists(lp, rp))]
    torch.testing.assert_close(kl_penalty(lp, rp, name), torch.tensor(expected, dtype=torch.float32), **TOL)


@pytest.mark.parametrize("name", [n for n in KL_PENALTY_NAMES if n.endswith("+")])
def test_straight_through_value_of_named_gradient_of_k2(name):
    gen = torch.Generator().manual_seed(12)
    lp = make_log_probs(gen).requires_grad_(True)
    rp = make_log_probs(gen)
    value = kl_penalty(lp, rp, name)
    torch.testing.assert_close(value, kl_penalty(lp, rp, name[:-1]), **TOL)
    value.sum().backward()
    torch.testing.assert_close(lp.grad, (lp - rp).detach(), **TOL)  # d/dlp of 0.5 (lp - rp)^2


def test_kl_penalty_full_vocabulary():
    p = torch.log(torch.tensor([[[0.5, 0.5], [0.9, 0.1]]]))
    q = torch.log(torch.tensor([[[0.25, 0.75], [0.9, 0.1]]]))
    torch.testing.assert_close(kl_penalty(p, q, "full"), torch.tensor([[0.5 * math.log(4 / 3), 0.0]]))
    gen = torch.Generator().manual_seed(13)
    lp = torch.log_softmax(torch.randn(3, 4, 6, generator=gen), -1)
    lq = torch.log_softmax(torch.randn(3, 4, 6, generator=gen), -1)
    expected = [[ref.full_kl(a, b) for a, b in zip(ra, rb)] for ra, rb in zip(*as_lists(lp, lq))]
    torch.testing.assert_close(kl_penalty(lp, lq, "full"), torch.tensor(expected, dtype=torch.float32), **TOL)


def test_kl_penalty_bf16_and_errors():
    lp = torch.tensor([[-1.0, -2.0]], dtype=torch.bfloat16)
    rp = torch.tensor([[-2.0, -1.0]], dtype=torch.bfloat16)
    out = kl_penalty(lp, rp, "k3")
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch.tensor([[math.exp(-1), math.e - 2]]))
    with pytest.raises(ValueError, match="low_var_kl"):
        kl_penalty(lp, rp, "k4")
    with pytest.raises(ValueError, match="full\\+"):  # the message lists names; full+ is not one
        kl_penalty(lp, rp, "full+")
    with pytest.raises(ValueError, match="same shape"):
        kl_penalty(lp, rp[:, :1], "k1")


# ---------------------------------------------------------------------------------------- value loss
def test_value_loss_hand_computed():
    vpreds = torch.tensor([[1.0, 0.0, 5.0]])
    values = torch.tensor([[0.0, 0.0, 0.0]])
    returns = torch.tensor([[2.0, 1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    # token 0: unclipped (1-2)^2 = 1, clipped vpred 0.5: 2.25 -> 2.25 (clipped); token 1: 1, 1 -> 1
    vf_loss, vf_clipfrac = compute_value_loss(vpreds, returns, values, mask, cliprange_value=0.5)
    assert vf_loss.item() == pytest.approx(0.5 * (2.25 + 1.0) / 2)
    assert vf_clipfrac.item() == pytest.approx(0.5)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                                  "seq-mean-token-sum-norm"])
def test_value_loss_matches_reference(mode):
    gen = torch.Generator().manual_seed(14)
    values = torch.randn(8, 7, generator=gen)
    vpreds = values + 0.5 * torch.randn(8, 7, generator=gen)
    returns = torch.randn(8, 7, generator=gen)
    mask = make_mask(empty_row=True)
    vf_loss, vf_clipfrac = compute_value_loss(vpreds.to(torch.bfloat16).float(), returns, values, mask, 0.2, mode)
    exp_loss, exp_clipfrac = ref.value_loss(*as_lists(vpreds.to(torch.bfloat16).float(), returns, values, mask),
                                            0.2, mode)
    assert vf_loss.item() == pytest.approx(exp_loss, rel=1e-6, abs=1e-6)
    assert vf_clipfrac.item() == pytest.approx(exp_clipfrac, rel=1e-6, abs=1e-6)


# ---------------------------------------------------------------------------------------- controllers
def test_fixed_controller():
    ctrl = get_kl_controller(KLControlConfig(type="fixed", kl_coef=0.05))
    assert isinstance(ctrl, FixedKLController)
    ctrl.update(current_kl=10.0, n_steps=100)
    assert ctrl.value == 0.05


def test_adaptive_controller_ziegler_update_and_checkpoint():
    ctrl = get_kl_controller(KLControlConfig(type="adaptive", kl_coef=0.1, target_kl=1.0, horizon=100))
    assert isinstance(ctrl, AdaptiveKLController)
    ctrl.update(current_kl=2.0, n_steps=10)  # error clipped to +0.2: 0.1 * (1 + 0.2 * 10 / 100)
    assert ctrl.value == pytest.approx(0.102)
    ctrl.update(current_kl=0.9, n_steps=10)  # error -0.1: * (1 - 0.01)
    assert ctrl.value == pytest.approx(0.10098)
    restored = AdaptiveKLController(init_kl_coef=0.5, target_kl=1.0, horizon=100)
    restored.load_state_dict(ctrl.state_dict())
    assert restored.value == ctrl.value


def test_get_kl_controller_errors():
    for error in (ConfigError, NotImplementedError):  # verl raises NotImplementedError
        with pytest.raises(error, match="kl_ctrl.type.*'fixed' or 'adaptive'"):
            get_kl_controller(KLControlConfig(type="pid"))
    for error in (ConfigError, AssertionError):  # verl asserts
        with pytest.raises(error, match="target_kl > 0"):
            get_kl_controller(KLControlConfig(type="adaptive", target_kl=0.0))


def test_entropy_from_logits_reexport():
    torch.testing.assert_close(entropy_from_logits(torch.zeros(2, 3, 4)), torch.full((2, 3), math.log(4)))
