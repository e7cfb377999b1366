"""The optimal token baseline (OTB): a per-token baseline weighted by each path's gradient energy.

OTB: Li et al. 2026, "The Optimal Token Baseline: Variance Reduction for Long-Horizon LLM-RL"
(arXiv:2602.07078). For a token ``t`` of a response, the variance-optimal baseline of the
reward-to-go ``G_t`` over the responses to the same prompt weighs each response by the squared norm
of its score function up to ``t``. The logit-gradient proxy of that norm needs only the forward
pass: the gradient of ``log pi(y_j)`` with respect to the logits is ``e_{y_j} - pi``, whose squared
norm is ::

    w_j = ||e_{y_j} - pi_j||^2 = 1 - 2 pi_j(y_j) + sum_v pi_j(v)^2

so with ``W_t = sum_{j <= t} w_j`` (the path's accumulated energy)::

    B_t = sum_i G_i,t W_i,t / (sum_i W_i,t + epsilon)        (over the responses i of the group)
    A_t = G_t - B_t

``pi_j(y_j) = exp(old_log_probs)`` and ``sum_v pi_j(v)^2`` (``sum_pi_squared``) come from the actor's
old-log-prob pass (``actor.calculate_sum_pi_squared=true``). With truncated-IS weights of a rollout
correction, ``w_j`` is scaled by ``rho_j^2``, the baseline that minimises the error of the
importance-weighted gradient. Two alignments of ``t`` across a group, registered under verl's names:

- ``optimal_token_baseline``: by column of the response (single-turn responses);
- ``tir_optimal_token_baseline``: by the ordinal of the valid token (tool-integrated, multi-turn
  responses whose mask has gaps: the ``k``-th generated token of each response meet).

A group of one has baseline 0 (``A = G``). With ``handle_zero_tail``, the part of the one longest
response of a group that reaches past the second longest gets baseline 0 too (no other response
informs it). Returns are the reward-to-go ``G`` (0 outside the mask).
"""

from __future__ import annotations

import torch

from rlvr.trainer.ppo.advantage import AdvantageEstimator, _group_ids, _require, register_adv_est

__all__ = ["compute_multi_turn_optimal_token_baseline_advantage", "compute_optimal_token_baseline_advantage",
           "path_energy"]


def path_energy(old_log_probs: torch.Tensor, sum_pi_squared: torch.Tensor, response_mask: torch.Tensor,
                rollout_is_weights: torch.Tensor | None = None) -> torch.Tensor:
    """``W_t``: the cumulative sum over the valid tokens up to ``t`` of
    ``(1 - 2 exp(old_log_probs) + sum_pi_squared) * rollout_is_weights^2``; all ``[batch, response_len]``."""
    energy = 1.0 - 2.0 * old_log_probs.float().exp() + sum_pi_squared.float()
    if rollout_is_weights is not None:
        energy = energy * rollout_is_weights.float().square()
    return (energy * response_mask.float()).cumsum(dim=-1)


def _reward_to_go(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    return (token_level_rewards.float() * response_mask.float()).flip(-1).cumsum(-1).flip(-1)


def _group_baseline(returns: torch.Tensor, energy: torch.Tensor, group_ids: torch.Tensor, member: torch.Tensor,
                    lengths: torch.Tensor, epsilon: float, handle_zero_tail: bool) -> torch.Tensor:
    """Per-row baseline ``[B, T]`` from aligned ``returns`` and ``energy`` (0 where a row has no
    token at that position): the energy-weighted group mean over the member rows of each group,
    0 for groups of one member and, with ``handle_zero_tail``, 0 from the second longest member's
    length on for a group's unique longest member. ``lengths`` ``[B]`` counts each row's tokens."""
    groups = int(group_ids.max()) + 1
    weight = member.float()[:, None]
    numerator = returns.new_zeros(groups, returns.shape[1]).index_add_(0, group_ids, returns * energy * weight)
    denominator = returns.new_zeros(groups, returns.shape[1]).index_add_(0, group_ids, energy * weight) + epsilon
    size = returns.new_zeros(groups).index_add_(0, group_ids, member.float())
    baseline = (numerator / denominator)[group_ids] * ((size[group_ids] > 1) & member).float()[:, None]
    if not handle_zero_tail:
        return baseline
    member_lengths = torch.where(member, lengths, torch.full_like(lengths, -1))
    longest = torch.full((groups,), -1, dtype=lengths.dtype, device=lengths.device).scatter_reduce(
        0, group_ids, member_lengths, "amax")
    at_longest = member & (lengths == longest[group_ids])
    count_longest = torch.zeros(groups, dtype=torch.long, device=lengths.device).index_add_(
        0, group_ids, at_longest.long())
    second = torch.full((groups,), -1, dtype=lengths.dtype, device=lengths.device).scatter_reduce(
        0, group_ids, member_lengths.masked_fill(at_longest, -1), "amax")
    tail_row = at_longest & (count_longest[group_ids] == 1) & (size[group_ids] > 1)
    columns = torch.arange(returns.shape[1], device=returns.device)
    tail = tail_row[:, None] & (columns[None, :] >= second[group_ids][:, None])
    return baseline.masked_fill(tail, 0.0)


def _inputs(old_log_probs, sum_pi_squared, estimator):
    old_log_probs = _require(old_log_probs, estimator, "old_log_probs (the actor's log-probs)",
                             "compute the actor's log-probs before the advantages")
    sum_pi_squared = _require(sum_pi_squared, estimator, "sum_pi_squared (sum_v pi(v)^2 per token)",
                              "set actor_rollout_ref.actor.calculate_sum_pi_squared=true")
    return old_log_probs, sum_pi_squared


@register_adv_est(AdvantageEstimator.OPTIMAL_TOKEN_BASELINE, needs_groups=True, reads_old_log_prob=True,
                  needs_sum_pi_squared=True)
def compute_optimal_token_baseline_advantage(token_level_rewards, response_mask, index, old_log_probs, sum_pi_squared,
                                             rollout_is_weights=None, handle_zero_tail=True, epsilon=1e-8, **kwargs):
    """OTB with the responses of a group aligned by column (see the module docstring).

    Args:
        token_level_rewards, response_mask, old_log_probs, sum_pi_squared: ``[batch, response_len]``.
        index: ``[batch]`` prompt uid of each row.
        rollout_is_weights: ``[batch, response_len]`` truncated IS weights, or None.
        handle_zero_tail: baseline 0 on the unique longest response's tail past the second longest.
        epsilon: added to the baseline's denominator.

    Returns:
        ``(advantages, returns)``: ``G_t - B_t`` and ``G_t``, ``[batch, response_len]``, 0 outside the mask.
    """
    old_log_probs, sum_pi_squared = _inputs(old_log_probs, sum_pi_squared, "optimal_token_baseline")
    mask = response_mask.float()
    returns = _reward_to_go(token_level_rewards, mask)
    energy = path_energy(old_log_probs, sum_pi_squared, mask, rollout_is_weights) * mask
    group_ids = _group_ids(index, mask.shape[0], "optimal_token_baseline").to(mask.device)
    everyone = torch.ones(mask.shape[0], dtype=torch.bool, device=mask.device)
    baseline = _group_baseline(returns * mask, energy, group_ids, everyone, mask.sum(-1).long(), epsilon,
                               handle_zero_tail)
    return (returns - baseline) * mask, returns * mask


@register_adv_est(AdvantageEstimator.TIR_OPTIMAL_TOKEN_BASELINE, needs_groups=True, reads_old_log_prob=True,
                  needs_sum_pi_squared=True)
def compute_multi_turn_optimal_token_baseline_advantage(token_level_rewards, response_mask, index, old_log_probs,
                                                        sum_pi_squared, rollout_is_weights=None, handle_zero_tail=True,
                                                        epsilon=1e-8, **kwargs):
    """OTB with the responses of a group aligned by their valid tokens (see the module docstring):
    the ``k``-th generated token of each response shares a baseline, whatever tool output came
    before it. Responses with no valid token take no part (their advantages are 0). Arguments and
    returns as :func:`compute_optimal_token_baseline_advantage`."""
    old_log_probs, sum_pi_squared = _inputs(old_log_probs, sum_pi_squared, "tir_optimal_token_baseline")
    mask = response_mask.float()
    valid = mask > 0
    returns = _reward_to_go(token_level_rewards, mask)
    energy = path_energy(old_log_probs, sum_pi_squared, mask, rollout_is_weights)
    lengths = valid.sum(-1)
    width = int(lengths.max()) if lengths.numel() else 0
    ordinal = valid.long().cumsum(-1) - 1  # the position of each valid token among its row's valid tokens
    rows = torch.arange(mask.shape[0], device=mask.device)[:, None].expand_as(ordinal)
    packed_returns = returns.new_zeros(mask.shape[0], width).index_put_((rows[valid], ordinal[valid]), returns[valid])
    packed_energy = returns.new_zeros(mask.shape[0], width).index_put_((rows[valid], ordinal[valid]), energy[valid])
    group_ids = _group_ids(index, mask.shape[0], "tir_optimal_token_baseline").to(mask.device)
    baseline = _group_baseline(packed_returns, packed_energy, group_ids, lengths > 0, lengths, epsilon,
                               handle_zero_tail)
    advantages = torch.zeros_like(returns)
    advantages[valid] = (packed_returns - baseline)[rows[valid], ordinal[valid]]
    return advantages, returns * mask
