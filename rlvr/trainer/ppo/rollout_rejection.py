"""verl's rejection options of ``algorithm.rollout_correction.rollout_rs`` (pure torch).

An option is ``<aggregate>_<statistic>``: the statistic of each token, from ``log_ratio = log pi_old -
log pi_rollout`` (clamped to +-20), is ``k1 = -log_ratio``, ``k2 = log_ratio^2 / 2`` or
``k3 = exp(log_ratio) - 1 - log_ratio`` (Schulman's KL estimators); the aggregate is ``token`` (each
token alone) or the sequence's ``seq_sum``, ``seq_mean`` or ``seq_max`` (all its tokens share the
verdict). A ``k1`` statistic is kept inside ``[log lower, log upper]``, ``k2`` / ``k3`` below
``upper``. Several options, comma-separated (``"token_k1,seq_mean_k3"``), must all pass.
``rollout_rs_threshold`` gives one threshold for all options or one per option, comma-separated; a
``k1`` threshold is ``upper`` (lower = 1 / upper) or ``"lower_upper"``. The masks and thresholds are
verl 0.9's (its ``compute_rollout_rejection_mask``).
"""

from __future__ import annotations

import math

import torch

from rlvr.trainer.ppo.correction_thresholds import parse_rs_thresholds
from rlvr.utils.torch_functional import masked_mean, masked_sum

__all__ = ["rs_option_mask"]

SAFETY_BOUND = 20.0


def _sequence(stat: torch.Tensor, mask: torch.Tensor, aggregate: str) -> torch.Tensor:
    """``[B]`` the sequence aggregate of a per-token statistic ``[B, R]``."""
    if aggregate == "seq_sum":
        return masked_sum(stat, mask, axis=-1)
    if aggregate == "seq_mean":
        return masked_mean(stat, mask, axis=-1)
    filled = stat.masked_fill(~mask.bool(), float("-inf")).max(dim=-1).values
    return torch.where(torch.isinf(filled), torch.zeros_like(filled), filled)


def rs_option_mask(log_ratio: torch.Tensor, response_mask: torch.Tensor, options: str, thresholds: object
                   ) -> tuple[torch.Tensor, dict[str, float]]:
    """``response_mask`` ``[B, R]`` without the tokens (or sequences) that fail any option, and the
    share of valid tokens each option drops (``rollout_rs_<option>_masked_fraction``) and all
    together (``rollout_rs_masked_fraction``)."""
    bounds = parse_rs_thresholds(options, thresholds)
    lr = log_ratio.float().clamp(-SAFETY_BOUND, SAFETY_BOUND)
    stats = {"k1": -lr, "k2": 0.5 * lr.square(), "k3": torch.exp(lr) - 1.0 - lr}
    mask = response_mask.float()
    keep = torch.ones_like(mask, dtype=torch.bool)
    metrics = {}
    for name, (lower, upper) in bounds.items():
        aggregate, statistic = name.rsplit("_", 1)
        value = stats[statistic] if aggregate == "token" else _sequence(stats[statistic], mask, aggregate)[:, None]
        if statistic == "k1":
            passed = (value >= math.log(lower)) & (value <= math.log(upper))
        else:
            passed = value <= upper
        passed = passed.expand_as(mask)
        metrics[f"rollout_rs_{name}_masked_fraction"] = masked_mean((~passed).float(), mask).item()
        keep &= passed
    metrics["rollout_rs_masked_fraction"] = masked_mean((~keep).float(), mask).item()
    return response_mask * keep.to(response_mask.dtype), metrics
