"""verl's bypass-mode loss and REINFORCE: agreement with the loop references (1e-6), the dispatch
on ``loss_type``, the rejection applied to both, and the errors of a missing or wrong section."""

from __future__ import annotations

import math

import pytest
import torch

import algos_reference_impl as ref
import ppo_reference_impl as ppo_ref
from ppo_test_data import as_lists, make_log_probs, make_mask
from rlvr.trainer.config import ActorConfig
from rlvr.trainer.ppo.core_algos import compute_policy_loss_reinforce, get_policy_loss_fn
from rlvr.trainer.ppo.policy_loss import AGG_LOSS_MODES


def _batch(seed: int):
    gen = torch.Generator().manual_seed(seed)
    mask = make_mask(empty_row=True)
    rollout = make_log_probs(gen)
    new = rollout + 0.6 * torch.randn(rollout.shape, generator=gen)
    return rollout, new, torch.randn(rollout.shape, generator=gen), mask


def _close(actual, expected):
    assert math.isclose(float(actual), expected, rel_tol=1e-6, abs_tol=1e-6), (float(actual), expected)


def _config(**rollout_correction):
    """verl's actor config after bypass mode set it up: the rollout_correction section inside policy_loss."""
    return {"clip_ratio": 0.2, "clip_ratio_c": 3.0, "global_batch_info": {},
            "policy_loss": {"loss_mode": "bypass_mode", "rollout_correction": rollout_correction}}


@pytest.mark.parametrize("mode", AGG_LOSS_MODES)
def test_reinforce_matches_reference(mode):
    rollout, new, adv, mask = _batch(1)
    weights = torch.rand(rollout.shape, generator=torch.Generator().manual_seed(2))
    for w in (None, weights):
        loss, metrics = compute_policy_loss_reinforce(rollout, new, adv, mask, mode, ActorConfig(), w)
        expected, kl = ref.reinforce(*as_lists(rollout, new, adv, mask), mode, as_lists(w)[0] if w is not None else None)
        _close(loss, expected)
        _close(metrics["ppo_kl"], kl)


def test_bypass_ppo_clip_is_vanilla_on_the_kept_tokens():
    rollout, new, adv, mask = _batch(3)
    config = _config(rollout_is="token", rollout_is_threshold=2.0, rollout_rs="token", rollout_rs_threshold=1.5,
                     rollout_rs_threshold_lower=0.7)
    loss, metrics = get_policy_loss_fn("bypass_mode")(rollout, new, adv, mask, "token-mean", config)
    _, kept = ref.token_correction(*as_lists(rollout, new, mask), 2.0, 1.5, 0.7)
    expected = ppo_ref.ppo_loss(*as_lists(rollout, new, adv), kept, 0.2, 0.2, 3.0, "token-mean")
    _close(loss, expected[0])
    _close(metrics["pg_clipfrac"], expected[1])
    dropped = 1 - sum(map(sum, kept)) / mask.sum().item()
    assert 0 < dropped < 1
    _close(metrics["rollout_corr/rollout_rs_masked_fraction"], dropped)
    assert "rollout_corr/rollout_is_mean" in metrics  # the weights are formed for the metrics, not applied


def test_bypass_reinforce_applies_the_truncated_weights():
    rollout, new, adv, mask = _batch(5)
    config = _config(loss_type="reinforce", rollout_is="token", rollout_is_threshold=1.5, rollout_rs="token",
                     rollout_rs_threshold=3.0, rollout_rs_threshold_lower=0.4)
    loss, metrics = get_policy_loss_fn("bypass_mode")(rollout, new, adv, mask, "seq-mean-token-mean", config)
    weights, kept = ref.token_correction(*as_lists(rollout, new, mask), 1.5, 3.0, 0.4)
    expected, kl = ref.reinforce(*as_lists(rollout, new, adv), kept, "seq-mean-token-mean", weights)
    _close(loss, expected)
    _close(metrics["ppo_kl"], kl)


def test_bypass_without_a_correction_is_plain_ppo():
    rollout, new, adv, mask = _batch(7)
    loss, _ = get_policy_loss_fn("bypass_mode")(rollout, new, adv, mask, "token-mean", _config())
    _close(loss, ppo_ref.ppo_loss(*as_lists(rollout, new, adv, mask), 0.2, 0.2, 3.0, "token-mean")[0])


def test_bypass_errors_say_what_is_missing():
    rollout, new, adv, mask = _batch(9)
    with pytest.raises(ValueError, match="algorithm.rollout_correction.bypass_mode=true"):
        get_policy_loss_fn("bypass_mode")(rollout, new, adv, mask, "token-mean", ActorConfig())
    with pytest.raises(ValueError, match="ppo_clip or reinforce"):
        get_policy_loss_fn("bypass_mode")(rollout, new, adv, mask, "token-mean", _config(loss_type="ppo"))
