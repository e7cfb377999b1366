"""Rollout correction: IS weights, rejection masks and mismatch metrics against loop references and
hand-computed values, and its effect on the policy loss on a crafted batch."""

from __future__ import annotations

import math

import pytest
import torch

from rlvr.trainer.ppo.core_algos import get_policy_loss_fn
from rlvr.trainer.ppo.rollout_correction import (
    ROLLOUT_RATIO_LEVELS,
    compute_rollout_correction_and_rejection_mask,
    compute_rollout_correction_weights,
    compute_rollout_mismatch_metrics,
    compute_rollout_rejection_mask,
)


def _batch(seed: int):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(5, 7, generator=gen) * 3
    rollout = old + 0.5 * torch.randn(5, 7, generator=gen)
    lengths = [7, 4, 1, 0, 6]  # row 3 has no valid token
    mask = torch.tensor([[1.0 if t < n else 0.0 for t in range(7)] for n in lengths])
    return old, rollout, mask


def _loop_level_log_ratios(old, rollout, mask, level: str) -> list[list[float]]:
    """Per-token log-ratio at ``level``, computed with Python loops."""
    out = []
    for b in range(old.shape[0]):
        valid = [t for t in range(old.shape[1]) if mask[b, t] > 0]
        token = [float(old[b, t]) - float(rollout[b, t]) for t in range(old.shape[1])]
        total = sum(token[t] for t in valid)
        if level == "token":
            out.append(token)
        elif level == "sequence":
            out.append([total] * old.shape[1])
        else:
            out.append([total / len(valid) if valid else 0.0] * old.shape[1])
    return out


def test_levels_are_registered():
    assert ROLLOUT_RATIO_LEVELS.names() == ["geometric", "sequence", "token"]


@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
def test_truncated_is_weights_match_loop_reference(level):
    old, rollout, mask = _batch(1)
    cap = 1.3
    weights, metrics = compute_rollout_correction_weights(old - rollout, mask, level, cap)
    levels = _loop_level_log_ratios(old, rollout, mask, level)
    raw, capped = [], []
    for b in range(old.shape[0]):
        for t in range(old.shape[1]):
            expected = min(math.exp(levels[b][t]), cap) if mask[b, t] > 0 else 0.0
            assert math.isclose(float(weights[b, t]), expected, rel_tol=1e-5, abs_tol=1e-6), (b, t)
            if mask[b, t] > 0:
                raw.append(math.exp(levels[b][t]))
                capped.append(expected)
    assert not weights.requires_grad
    assert math.isclose(metrics["rollout_is_mean"], sum(capped) / len(capped), rel_tol=1e-5)
    assert math.isclose(metrics["rollout_is_max"], max(raw), rel_tol=1e-5)
    assert math.isclose(metrics["rollout_is_min"], min(raw), rel_tol=1e-5)
    assert math.isclose(metrics["rollout_is_ratio_fraction_high"], sum(r > cap for r in raw) / len(raw), rel_tol=1e-6)
    mean = sum(capped) / len(capped)
    ess = 1.0 / (sum((w / mean) ** 2 for w in capped) / len(capped))
    assert math.isclose(metrics["rollout_is_eff_sample_size"], ess, rel_tol=1e-5)


@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
def test_rejection_mask_matches_loop_reference(level):
    old, rollout, mask = _batch(2)
    upper, lower = 1.5, 0.8
    modified, metrics = compute_rollout_rejection_mask(old - rollout, mask, level, upper, lower)
    levels = _loop_level_log_ratios(old, rollout, mask, level)
    dropped = valid = 0
    seqs_dropped, seqs_valid = 0, 0
    for b in range(old.shape[0]):
        row_dropped = False
        for t in range(old.shape[1]):
            keep = lower <= math.exp(levels[b][t]) <= upper
            assert float(modified[b, t]) == (float(mask[b, t]) if keep else 0.0), (b, t)
            if mask[b, t] > 0:
                valid += 1
                dropped += not keep
                row_dropped |= not keep
        if mask[b].sum() > 0:
            seqs_valid += 1
            seqs_dropped += row_dropped
    assert modified.dtype == mask.dtype
    assert math.isclose(metrics["rollout_rs_masked_fraction"], dropped / valid, rel_tol=1e-6)
    assert math.isclose(metrics["rollout_rs_seq_masked_fraction"], seqs_dropped / seqs_valid, rel_tol=1e-6)


def test_rejection_band_defaults_to_reciprocal_lower_bound():
    log_ratio = torch.log(torch.tensor([[0.4, 0.6, 1.0, 1.9, 2.1]]))
    modified, _ = compute_rollout_rejection_mask(log_ratio, torch.ones(1, 5), "token", 2.0)
    assert modified.tolist() == [[0.0, 1.0, 1.0, 1.0, 0.0]]


def test_bad_settings_are_rejected_with_the_valid_names():
    old, rollout, mask = _batch(3)
    with pytest.raises(KeyError, match="geometric, sequence, token"):
        compute_rollout_correction_weights(old - rollout, mask, "seq", 2.0)
    with pytest.raises(ValueError, match="the bounds must be > 0"):
        compute_rollout_correction_weights(old - rollout, mask, "token", 0.0)
    with pytest.raises(ValueError, match="0 < lower < upper"):
        compute_rollout_rejection_mask(old - rollout, mask, "token", 2.0, 3.0)
    with pytest.raises(ValueError, match="same \\[batch, response_len\\] shape"):
        compute_rollout_correction_and_rejection_mask(old, rollout[:, :3], mask, rollout_is="token")


# ----------------------------------------------------------------------------------- crafted batch
# One sequence of 3 tokens; the actor's current and old log-probs agree (PPO ratio 1, nothing
# clipped), advantages are 1, so the vanilla loss of each token is -1 times its weight. The rollout
# engine gave the tokens log-probs such that rho = pi_old / pi_rollout = [4, 1, 0.5].
RHO = [4.0, 1.0, 0.5]


def _crafted():
    old = torch.log(torch.tensor([[0.8, 0.5, 0.2]]))
    rollout = old - torch.log(torch.tensor([RHO]))
    return old, rollout, torch.ones(1, 3), torch.ones(1, 3)


def _loss(old, advantages, mask, weights):
    loss, _ = get_policy_loss_fn("vanilla")(old, old.clone(), advantages, mask, loss_agg_mode="token-mean",
                                            rollout_is_weights=weights)
    return loss.item()


@pytest.mark.parametrize("settings, expected_loss", [
    ({}, -1.0),  # off: plain mean of -1
    ({"rollout_is": "token", "rollout_is_threshold": 2.0}, -(2.0 + 1.0 + 0.5) / 3),  # min(rho_t, 2)
    ({"rollout_is": "sequence", "rollout_is_threshold": 5.0}, -2.0),  # 4 * 1 * 0.5 = 2 on every token
    ({"rollout_is": "sequence", "rollout_is_threshold": 1.5}, -1.5),  # the product, capped
    ({"rollout_is": "geometric", "rollout_is_threshold": 5.0}, -(2.0 ** (1 / 3))),  # (4 * 1 * 0.5)^(1/3)
    ({"rollout_rs": "token", "rollout_rs_threshold": 2.0}, -1.0),  # token 0 (rho 4) leaves [0.5, 2]: mean of 2
    ({"rollout_is": "token", "rollout_is_threshold": 2.0, "rollout_rs": "token", "rollout_rs_threshold": 3.0,
      "rollout_rs_threshold_lower": 0.6}, -1.0),  # only token 1 (rho 1, weight 1) is kept
    ({"rollout_rs": "sequence", "rollout_rs_threshold": 1.5}, 0.0),  # product 2 > 1.5: the sequence is dropped
])
def test_correction_changes_the_loss_as_the_formula_says(settings, expected_loss):
    old, rollout, advantages, mask = _crafted()
    weights, new_mask, metrics = compute_rollout_correction_and_rejection_mask(old, rollout, mask, **settings)
    assert (weights is None) == ("rollout_is" not in settings)
    assert all(name.startswith("rollout_corr/") for name in metrics)
    assert math.isclose(_loss(old, advantages, new_mask, weights), expected_loss, rel_tol=1e-5, abs_tol=1e-6)


def test_crafted_batch_metrics():
    old, rollout, _, mask = _crafted()
    _, _, metrics = compute_rollout_correction_and_rejection_mask(
        old, rollout, mask, rollout_is="token", rollout_is_threshold=2.0, rollout_rs="token", rollout_rs_threshold=2.0)
    assert metrics["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(1 / 3)  # one token capped
    assert metrics["rollout_corr/rollout_is_max"] == pytest.approx(4.0)
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(1 / 3)  # one token dropped
    assert metrics["rollout_corr/rollout_rs_seq_masked_fraction"] == pytest.approx(1.0)


# -------------------------------------------------------------------------------- mismatch metrics
def test_mismatch_metrics_hand_computed():
    old = torch.log(torch.tensor([[0.5, 0.25, 0.9]]))
    rollout = torch.log(torch.tensor([[0.4, 0.25, 0.1]]))  # the last token is padding
    mask = torch.tensor([[1, 1, 0]])
    metrics = compute_rollout_mismatch_metrics(old, rollout, mask, threshold=0.1)
    log_diffs = [abs(math.log(0.4) - math.log(0.5)), 0.0]
    rho = [0.5 / 0.4, 1.0]
    expected = {
        "training/rollout_probs_diff_valid": 1.0,
        "training/rollout_probs_diff_max": 0.1,
        "training/rollout_probs_diff_mean": 0.05,
        "training/rollout_probs_diff_std": 0.05,
        "training/rollout_log_probs_diff_max": log_diffs[0],
        "training/rollout_log_probs_diff_mean": sum(log_diffs) / 2,
        "training/rollout_log_probs_diff_frac_over": 0.5,  # 0.223 > 0.1, 0 is not
        "rollout_corr/kl": (math.log(0.4) - math.log(0.5)) / 2,
        "rollout_corr/k3_kl": sum(r - 1 - math.log(r) for r in rho) / 2,
    }
    assert set(metrics) == set(expected)
    for name, value in expected.items():
        assert metrics[name] == pytest.approx(value, rel=1e-5, abs=1e-7), name


def test_identical_log_probs_report_zero_mismatch():
    old, _, mask = _batch(4)
    metrics = compute_rollout_mismatch_metrics(old, old.clone(), mask, threshold=0.0)
    assert metrics.pop("training/rollout_probs_diff_valid") == 1.0
    assert all(value == 0.0 for value in metrics.values()), metrics


def test_mismatch_metrics_without_valid_tokens():
    old, rollout, _ = _batch(5)
    assert compute_rollout_mismatch_metrics(old, rollout, torch.zeros_like(old), 0.1) == {
        "training/rollout_probs_diff_valid": 0.0}
