"""verl's ``bypass_mode`` policy loss and the REINFORCE loss it can dispatch to.

In bypass mode the rollout engine's log-probs are the old policy (no separate actor pass), so the
``old_log_prob`` a loss receives *is* ``rollout_log_prob``. verl then switches the actor to this loss,
which forms the importance weights and the rejection mask of the whole rollout/actor gap itself and
dispatches on ``rollout_correction.loss_type``:

- ``"ppo_clip"`` (default): clipped PPO (``vanilla``) on the tokens the rejection keeps; no IS
  weights, since the PPO ratio ``pi_theta / pi_rollout`` already is the correction;
- ``"reinforce"``: :func:`compute_policy_loss_reinforce` with the truncated IS weights
  ``min(pi_theta / pi_rollout, rollout_is_threshold)`` (no gradient through them).

The settings come from ``config.policy_loss.rollout_correction`` (verl copies the algorithm's
``rollout_correction`` section there). rlvr's trainer applies bypass mode itself for every loss
(``algorithm.rollout_correction.bypass_mode=true``: the rejection runs in the actor, the configured
``loss_mode`` stays), so ``loss_mode=bypass_mode`` is refused in a run config; this entry serves code
that calls verl's registry directly. The IS weights and the rejection are
:func:`~rlvr.trainer.ppo.rollout_correction.compute_rollout_correction_and_rejection_mask`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from rlvr.trainer.ppo.policy_loss import (
    _actor,
    _aggregate,
    _as_float,
    _metrics,
    _zero,
    compute_policy_loss_vanilla,
    register_policy_loss,
)
from rlvr.trainer.ppo.rollout_correction import compute_rollout_correction_and_rejection_mask
from rlvr.utils.config_view import config_view
from rlvr.utils.torch_functional import masked_mean

__all__ = ["BYPASS_LOSS_TYPES", "BypassLossSettings", "compute_policy_loss_bypass_mode",
           "compute_policy_loss_reinforce"]

BYPASS_LOSS_TYPES = ("ppo_clip", "reinforce")


@dataclass
class BypassLossSettings:
    """What the ``bypass_mode`` loss reads of ``config.policy_loss.rollout_correction`` (verl's keys
    and defaults; a missing key takes the default)."""

    loss_type: str = "ppo_clip"
    """ppo_clip | reinforce."""
    rollout_is: Optional[str] = None
    """level of the IS weights (token | sequence | geometric); None: no weights."""
    rollout_is_threshold: float = 2.0
    """cap of the IS weights."""
    rollout_rs: Optional[str] = None
    """level of the rejection; None: no rejection."""
    rollout_rs_threshold: Optional[float] = None
    """upper bound of the rejection band (None: rollout_is_threshold)."""
    rollout_rs_threshold_lower: Optional[float] = None
    """lower bound of the rejection band (None: 1 / upper)."""


@dataclass
class _PolicyLossWithCorrection:
    """The part of ``config.policy_loss`` this loss reads (rlvr's section has no such key)."""

    rollout_correction: Optional[Any] = None
    """verl's ``rollout_correction`` section, copied in by verl's trainer in bypass mode."""


def compute_policy_loss_reinforce(rollout_log_prob, log_prob, advantages, response_mask,
                                  loss_agg_mode="seq-mean-token-sum", config=None, rollout_is_weights=None):
    """REINFORCE (Williams 1992) with optional importance weights (verl's signature)::

        loss_t = -A_t * log pi(y_t) * sg(w_t)        (w_t = 1 without ``rollout_is_weights``)

    No ratio and no clip. ``ppo_kl`` is ``mean(log pi_rollout - log pi)`` over the mask.

    Args:
        rollout_log_prob, log_prob, advantages, response_mask: ``[batch, response_len]``.
        loss_agg_mode: see ``agg_loss`` (verl's default here is ``seq-mean-token-sum``).
        config: the actor section (its ``global_batch_info``).
        rollout_is_weights: ``[batch, response_len]`` or None.

    Returns:
        ``(loss, metrics)`` with rlvr's four metrics (clip fractions 0).
    """
    config = _actor(config)
    rollout_log_prob, log_prob, advantages = _as_float(rollout_log_prob, log_prob, advantages)
    pg_loss = _aggregate(-advantages * log_prob, response_mask, loss_agg_mode, config, rollout_is_weights)
    return pg_loss, _metrics(pg_loss, _zero(log_prob), masked_mean(rollout_log_prob - log_prob, response_mask),
                             _zero(log_prob))


@register_policy_loss("bypass_mode")
def compute_policy_loss_bypass_mode(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                                    config=None, rollout_is_weights=None):
    """verl's bypass-mode loss (see the module docstring); ``old_log_prob`` is the rollout's.

    The weights and the rejection are formed from ``log_prob`` (detached) against ``old_log_prob``;
    the ``rollout_is_weights`` argument is not used (the loss forms its own, as verl). The
    ``rollout_corr/*`` metrics of that correction are added to the loss's metrics.

    Raises:
        ValueError: ``config.policy_loss.rollout_correction`` is missing, or an unknown ``loss_type``.
    """
    section = config_view(_actor(config).policy_loss, _PolicyLossWithCorrection).rollout_correction
    if section is None:
        raise ValueError("the bypass_mode loss reads its settings from config.policy_loss.rollout_correction, which "
                         "is missing; in an rlvr run set algorithm.rollout_correction.bypass_mode=true instead")
    settings = config_view(section, BypassLossSettings)
    if settings.loss_type not in BYPASS_LOSS_TYPES:
        raise ValueError(f"rollout_correction.loss_type {settings.loss_type!r} is not valid; use "
                         f"{' or '.join(BYPASS_LOSS_TYPES)}")
    with torch.no_grad():
        weights, mask, correction_metrics = compute_rollout_correction_and_rejection_mask(
            log_prob.detach(), old_log_prob, response_mask, rollout_is=settings.rollout_is,
            rollout_is_threshold=settings.rollout_is_threshold, rollout_rs=settings.rollout_rs,
            rollout_rs_threshold=settings.rollout_rs_threshold,
            rollout_rs_threshold_lower=settings.rollout_rs_threshold_lower)
    if settings.loss_type == "reinforce":
        pg_loss, metrics = compute_policy_loss_reinforce(old_log_prob, log_prob, advantages, mask, loss_agg_mode,
                                                         config, weights)
    else:
        pg_loss, metrics = compute_policy_loss_vanilla(old_log_prob, log_prob, advantages, mask, loss_agg_mode,
                                                       config, None)
    return pg_loss, {**metrics, **{name: torch.tensor(value) for name, value in correction_metrics.items()}}
