"""Policy losses that keep the update near the old policy without PPO's ratio clip.

Registered under verl 0.9's names, with its signature (see :mod:`rlvr.trainer.ppo.policy_loss`)::

    fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
       config=None, rollout_is_weights=None) -> (loss, metrics)

- ``dppo_tv`` / ``dppo_kl``: DPPO (Qi et al. 2026, "Rethinking the Trust Region in LLM Reinforcement
  Learning", arXiv:2602.04879). A token takes part in the update only while the policy has not moved
  past a divergence bound on it; the bound is on the sampled token's probability itself (binary total
  variation, or the binary KL divergence), not on the ratio.
- ``sapo``: SAPO (Gao et al. 2025, "Soft Adaptive Policy Optimization", arXiv:2511.20347). A smooth,
  temperature-controlled gate of the ratio in place of the hard clip.
- ``dro``: DRO (Richemond et al. 2024, "Offline Regularised Reinforcement Learning for Large Language
  Models Alignment", arXiv:2405.19107; the loss of Kimi k1.5, arXiv:2501.12599). The log-likelihood
  times the advantage, with a quadratic penalty on the log-ratio.

All inputs are ``[batch, response_len]`` and computed in float32; the log-ratio is clamped to
``[-20, 20]`` before ``exp`` (DRO takes no ``exp``). ``rollout_is_weights`` multiply the per-token
losses before aggregation. Metrics are rlvr's four (``pg_loss``, ``pg_clipfrac``, ``ppo_kl``,
``pg_clipfrac_lower``); a loss without clipping reports 0 for its clip fractions.
"""

from __future__ import annotations

import torch

from rlvr.trainer.ppo.policy_loss import (
    _actor,
    _aggregate,
    _as_float,
    _clip_range,
    _log_ratio,
    _metrics,
    _zero,
    register_policy_loss,
)
from rlvr.utils.errors import ConfigAssertionError, ConfigError
from rlvr.utils.torch_functional import masked_mean

__all__ = ["compute_policy_loss_dppo_kl", "compute_policy_loss_dppo_tv", "compute_policy_loss_dro",
           "compute_policy_loss_sapo", "SAPO_LOSS_AGG_MODE"]

SAPO_LOSS_AGG_MODE = "seq-mean-token-mean"
"""SAPO's objective is a mean over sequences of the mean over their tokens; verl fixes it too."""

_BINARY_KL_EPS = 1e-8


def _binary_kl(old_log_prob: torch.Tensor, log_prob: torch.Tensor) -> torch.Tensor:
    """KL divergence between two Bernoulli distributions, "the sampled token" or "any other":
    ``p_old log(p_old / p) + (1 - p_old) log((1 - p_old) / (1 - p))``, with ``1e-8`` added inside
    the second log against a probability of 1 (as verl)."""
    old_prob, prob = old_log_prob.exp(), log_prob.exp()
    return (old_prob * (old_log_prob - log_prob)
            + (1.0 - old_prob) * torch.log((1.0 - old_prob + _BINARY_KL_EPS) / (1.0 - prob + _BINARY_KL_EPS)))


def _dppo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights, inside):
    """The DPPO surrogate around a trust-region test ``inside(old_lp, lp, adv, low, high) -> bool [B, R]``.

    Per token: ``-A * sg(min(r, clip_ratio_c)) * log_prob`` on the tokens inside the trust region,
    0 outside (the region is the mask of the paper's binary approximation; the truncated ratio is its
    importance weight, section 5.4, capped at ``clip_ratio_c``)."""
    config = _actor(config)
    low, high = _clip_range(config)
    old_log_prob, log_prob, advantages = _as_float(old_log_prob, log_prob, advantages)
    log_ratio = _log_ratio(old_log_prob, log_prob)
    ratio = log_ratio.exp()
    truncated = ratio.clamp(max=config.clip_ratio_c).detach()
    valid = inside(old_log_prob.detach(), log_prob.detach(), advantages, low, high).float()
    pg_losses = -advantages * truncated * log_prob * valid
    pg_loss = _aggregate(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    return pg_loss, _metrics(pg_loss, masked_mean(1.0 - valid, response_mask), masked_mean(-log_ratio, response_mask),
                             masked_mean((ratio > config.clip_ratio_c).float() * valid, response_mask))


def _inside_tv(old_log_prob, log_prob, advantages, low, high):
    """Binary TV: the sampled token's probability rose by at most ``high`` (``A > 0``) or fell by
    at most ``low`` (``A <= 0``)."""
    shift = log_prob.exp() - old_log_prob.exp()
    return torch.where(advantages > 0, shift <= high, shift >= -low)


def _inside_kl(old_log_prob, log_prob, advantages, low, high):
    """Binary KL: within ``high`` (``A > 0``) / ``low`` (``A <= 0``), or moved the other way than the
    advantage pushes it (such a move is never cut)."""
    kl = _binary_kl(old_log_prob, log_prob)
    rose = log_prob.exp() >= old_log_prob.exp()
    fell = log_prob.exp() <= old_log_prob.exp()
    return torch.where(advantages > 0, (kl <= high) | fell, (kl <= low) | rose)


@register_policy_loss("dppo_tv")
def compute_policy_loss_dppo_tv(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                                config=None, rollout_is_weights=None):
    """DPPO-Binary-TV (Qi et al. 2026, arXiv:2602.04879)::

        loss_t = -A_t * sg(min(r_t, clip_ratio_c)) * log pi(y_t) * m_t
        m_t    = [pi(y_t) - pi_old(y_t) <= clip_ratio_high]   if A_t > 0
                 [pi(y_t) - pi_old(y_t) >= -clip_ratio_low]   otherwise

    ``clip_ratio_low`` / ``clip_ratio_high`` (default ``clip_ratio``) are bounds on the probability
    shift here, not on the ratio. Metrics: ``pg_clipfrac`` = tokens outside the trust region
    (``m_t = 0``); ``pg_clipfrac_lower`` = tokens inside it whose ratio was truncated at ``clip_ratio_c``.
    """
    return _dppo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights,
                 _inside_tv)


@register_policy_loss("dppo_kl")
def compute_policy_loss_dppo_kl(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                                config=None, rollout_is_weights=None):
    """DPPO-Binary-KL (Qi et al. 2026, arXiv:2602.04879): as ``dppo_tv`` with the trust region
    measured by the binary KL divergence ``D = p_old log(p_old/p) + (1-p_old) log((1-p_old)/(1-p))``
    of the sampled token's probability::

        m_t = [D <= clip_ratio_high or pi(y_t) <= pi_old(y_t)]   if A_t > 0
              [D <= clip_ratio_low  or pi(y_t) >= pi_old(y_t)]   otherwise
    """
    return _dppo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights,
                 _inside_kl)


def _positive(value: float, field: str, what: str) -> float:
    if value is None or value <= 0:
        raise ConfigAssertionError(f"actor_rollout_ref.actor.{field}", f"{what} must be > 0, got {value}")
    return value


@register_policy_loss("sapo")
def compute_policy_loss_sapo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode=SAPO_LOSS_AGG_MODE,
                             config=None, rollout_is_weights=None):
    """SAPO (Gao et al. 2025, "Soft Adaptive Policy Optimization", arXiv:2511.20347)::

        f_tau(r) = sigmoid(tau * (r - 1)) * 4 / tau        tau = tau_pos if A > 0 else tau_neg
        loss_t   = -f_tau(r_t) * A_t

    The gate's gradient, ``sigmoid'(tau (r - 1)) * 4 * r * grad log pi``, equals the plain policy
    gradient at ``r = 1`` and fades smoothly as the ratio leaves 1 (faster for larger ``tau``).
    The per-token losses are always averaged over each sequence's tokens, then over the sequences
    (``seq-mean-token-mean``, the paper's objective, as verl): ``loss_agg_mode`` is not used here
    (the actor still aggregates its entropy and KL terms with it). Metrics: clip fractions 0.
    """
    config = _actor(config)
    tau_pos = _positive(config.tau_pos, "tau_pos", "the SAPO temperature tau_pos")
    tau_neg = _positive(config.tau_neg, "tau_neg", "the SAPO temperature tau_neg")
    old_log_prob, log_prob, advantages = _as_float(old_log_prob, log_prob, advantages)
    log_ratio = _log_ratio(old_log_prob, log_prob)
    tau = torch.where(advantages > 0, torch.full_like(advantages, tau_pos), torch.full_like(advantages, tau_neg))
    gate = torch.sigmoid(tau * (log_ratio.exp() - 1.0)) * (4.0 / tau)
    pg_loss = _aggregate(-gate * advantages, response_mask, SAPO_LOSS_AGG_MODE, config, rollout_is_weights)
    return pg_loss, _metrics(pg_loss, _zero(log_prob), masked_mean(-log_ratio, response_mask), _zero(log_prob))


@register_policy_loss("dro")
def compute_policy_loss_dro(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                            config=None, rollout_is_weights=None):
    """DRO (Richemond et al. 2024, arXiv:2405.19107; Kimi k1.5's policy loss, arXiv:2501.12599)::

        loss_t = -(A_t * log pi(y_t) - beta / 2 * (log pi(y_t) - log pi_old(y_t))^2)

    with ``beta = policy_loss.dro_beta`` (required, > 0): the penalty pulls the policy back to the
    sampling policy quadratically in the log-ratio, so the loss works off-policy without a clip.
    Metrics: clip fractions 0.

    Raises:
        ConfigError: ``dro_beta`` is unset or not positive (a ``ValueError``, as verl raises).
    """
    config = _actor(config)
    beta = config.policy_loss.dro_beta
    if beta is None or beta <= 0:
        raise ConfigError("actor_rollout_ref.actor.policy_loss.dro_beta",
                          f"the DRO loss needs a positive penalty coefficient, got {beta}; set it (e.g. 0.1)")
    old_log_prob, log_prob, advantages = _as_float(old_log_prob, log_prob, advantages)
    log_ratio = log_prob - old_log_prob
    pg_losses = -(log_prob * advantages - 0.5 * beta * log_ratio.square())
    pg_loss = _aggregate(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    return pg_loss, _metrics(pg_loss, _zero(log_prob), masked_mean(-log_ratio, response_mask), _zero(log_prob))
