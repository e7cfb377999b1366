"""Core functions of PPO-like algorithms (the public entry point; pure torch, CPU-testable).

The code lives in small modules and is re-exported here under verl's names and signatures:

- ``rlvr.trainer.ppo.policy_loss``: ``agg_loss``, ``compute_policy_loss``, the policy-loss
  registry (``POLICY_LOSS_REGISTRY``, ``register_policy_loss``, ``get_policy_loss_fn``) and the losses.
- ``rlvr.trainer.ppo.advantage``: the advantage-estimator registry (``ADV_ESTIMATOR_REGISTRY``,
  ``AdvantageEstimator``, ``register_adv_est``, ``get_adv_estimator_fn``, what an entry needs:
  ``get_adv_estimator_needs``) and the estimators.
- ``rlvr.trainer.ppo.grpo_variants`` (GDPO, GRPO pass@k), ``rlvr.trainer.ppo.optimal_baseline`` (the
  optimal token baseline), ``rlvr.trainer.ppo.trust_region_losses`` (DPPO, SAPO, DRO) and
  ``rlvr.trainer.ppo.bypass_loss`` (verl's bypass-mode loss, REINFORCE): registered with the rest.
- ``rlvr.trainer.ppo.egpo``: the EGPO calibration math.
- ``rlvr.trainer.ppo.kl``: ``kl_penalty``, ``kl_penalty_forward`` and the KL-coefficient controllers.
- ``rlvr.utils.torch_functional``: ``masked_mean``, ``masked_whiten``, ``entropy_from_logits``.

Losses take the actor config section and estimators the algorithm section
(:mod:`rlvr.trainer.config.schema`); there is no other config type. This module adds the value
loss, the entropy loss and the KL-penalised token rewards.
"""

from __future__ import annotations

import torch

from rlvr.trainer.ppo import advantage, policy_loss
from rlvr.trainer.ppo.advantage import (
    ADV_ESTIMATOR_REGISTRY,
    AdvantageEstimator,
    AdvantageEstimatorNeeds,
    compute_egpo_outcome_advantage,
    compute_gae_advantage_return,
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_grpo_vectorized_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage,
    compute_rloo_vectorized_outcome_advantage,
    estimator_name,
    get_adv_estimator_needs,
)
from rlvr.trainer.ppo.bypass_loss import compute_policy_loss_bypass_mode, compute_policy_loss_reinforce
from rlvr.trainer.ppo.grpo_variants import compute_gdpo_outcome_advantage, compute_grpo_passk_outcome_advantage
from rlvr.trainer.ppo.kl import (
    AdaptiveKLController,
    FixedKLController,
    get_kl_controller,
    kl_penalty,
    kl_penalty_forward,
)
from rlvr.trainer.ppo.optimal_baseline import (
    compute_multi_turn_optimal_token_baseline_advantage,
    compute_optimal_token_baseline_advantage,
)
from rlvr.trainer.ppo.policy_loss import (
    AGG_LOSS_MODES,
    POLICY_LOSS_REGISTRY,
    agg_loss,
    compute_policy_loss,
    compute_policy_loss_cispo,
    compute_policy_loss_clip_cov,
    compute_policy_loss_geo_mean,
    compute_policy_loss_gpg,
    compute_policy_loss_gspo,
    compute_policy_loss_kl_cov,
    compute_policy_loss_vanilla,
)
from rlvr.trainer.ppo.trust_region_losses import (
    compute_policy_loss_dppo_kl,
    compute_policy_loss_dppo_tv,
    compute_policy_loss_dro,
    compute_policy_loss_sapo,
)
from rlvr.utils.registry import lookup_in, register_in
from rlvr.utils.torch_functional import clip_by_value, entropy_from_logits, masked_mean, masked_whiten

__all__ = [
    "ADV_ESTIMATOR_REGISTRY", "AGG_LOSS_MODES", "POLICY_LOSS_REGISTRY", "AdaptiveKLController",
    "AdvantageEstimator", "AdvantageEstimatorNeeds", "FixedKLController", "agg_loss",
    "compute_egpo_outcome_advantage", "compute_entropy_loss", "compute_gae_advantage_return",
    "compute_gdpo_outcome_advantage", "compute_grpo_passk_outcome_advantage",
    "compute_multi_turn_optimal_token_baseline_advantage", "compute_optimal_token_baseline_advantage",
    "compute_policy_loss_bypass_mode", "compute_policy_loss_dppo_kl", "compute_policy_loss_dppo_tv",
    "compute_policy_loss_dro", "compute_policy_loss_reinforce", "compute_policy_loss_sapo",
    "compute_gpg_outcome_advantage", "compute_grpo_outcome_advantage", "compute_grpo_vectorized_outcome_advantage",
    "compute_opo_outcome_advantage", "compute_policy_loss", "compute_policy_loss_cispo",
    "compute_policy_loss_clip_cov", "compute_policy_loss_geo_mean", "compute_policy_loss_gpg",
    "compute_policy_loss_gspo", "compute_policy_loss_kl_cov", "compute_policy_loss_vanilla",
    "compute_reinforce_plus_plus_baseline_outcome_advantage", "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage", "compute_rewards", "compute_rloo_outcome_advantage",
    "compute_rloo_vectorized_outcome_advantage", "compute_value_loss", "entropy_from_logits",
    "get_adv_estimator_fn", "get_adv_estimator_needs", "get_kl_controller", "get_policy_loss_fn", "kl_penalty",
    "kl_penalty_forward", "masked_mean", "masked_whiten", "register_adv_est", "register_policy_loss",
]


# verl's registry functions read this module's ``ADV_ESTIMATOR_REGISTRY`` / ``POLICY_LOSS_REGISTRY``
# when called, so that a table put in their place (verl's tests assign a plain dict) is the one
# used; normally they are the registries of rlvr.trainer.ppo.advantage / .policy_loss.
def register_adv_est(name_or_enum, *, needs_critic: bool = False, needs_groups: bool = False,
                     needs_greedy_baseline: bool = False, reads_old_log_prob: bool = False,
                     needs_sum_pi_squared: bool = False):
    """verl's decorator: register an advantage estimator under a string or ``Enum`` member (see
    :func:`rlvr.trainer.ppo.advantage.register_adv_est`)."""

    def add(fn):
        register_in(ADV_ESTIMATOR_REGISTRY, estimator_name(name_or_enum), fn, advantage.ADV_ESTIMATOR_REGISTRY,
                    needs_critic=needs_critic, needs_groups=needs_groups, needs_greedy_baseline=needs_greedy_baseline,
                    reads_old_log_prob=reads_old_log_prob, needs_sum_pi_squared=needs_sum_pi_squared)
        return fn

    return add


def get_adv_estimator_fn(name_or_enum):
    """verl's lookup of an advantage estimator (see :func:`rlvr.trainer.ppo.advantage.get_adv_estimator_fn`)."""
    return lookup_in(ADV_ESTIMATOR_REGISTRY, estimator_name(name_or_enum), advantage.ADV_ESTIMATOR_REGISTRY)


def register_policy_loss(name):
    """verl's decorator: register a policy loss (see :func:`rlvr.trainer.ppo.policy_loss.register_policy_loss`)."""

    def add(fn):
        register_in(POLICY_LOSS_REGISTRY, str(name), fn, policy_loss.POLICY_LOSS_REGISTRY)
        return fn

    return add


def get_policy_loss_fn(name):
    """verl's lookup of a policy loss (see :func:`rlvr.trainer.ppo.policy_loss.get_policy_loss_fn`)."""
    return lookup_in(POLICY_LOSS_REGISTRY, str(name), policy_loss.POLICY_LOSS_REGISTRY)


def compute_rewards(token_level_scores: torch.Tensor, old_log_prob: torch.Tensor, ref_log_prob: torch.Tensor,
                    kl_ratio: float) -> torch.Tensor:
    """Token rewards with a k1 KL penalty (Ziegler et al. 2019, arXiv:1909.08593):
    ``scores - kl_ratio * (old_log_prob - ref_log_prob)``; all ``[batch, response_len]``."""
    return token_level_scores - (old_log_prob - ref_log_prob) * kl_ratio


def compute_entropy_loss(logits: torch.Tensor, response_mask: torch.Tensor,
                         loss_agg_mode: str = "token-mean") -> torch.Tensor:
    """Mean entropy of ``softmax(logits)`` (``[batch, response_len, vocab]``) over the response
    tokens, aggregated with ``agg_loss``; a 0-dim float32 tensor."""
    return agg_loss(entropy_from_logits(logits), response_mask, loss_agg_mode)


def compute_value_loss(vpreds: torch.Tensor, returns: torch.Tensor, values: torch.Tensor,
                       response_mask: torch.Tensor, cliprange_value: float, loss_agg_mode: str = "token-mean",
                       dp_size: int = 1, batch_num_tokens: int | torch.Tensor | None = None,
                       global_batch_size: int | torch.Tensor | None = None,
                       loss_scale_factor: int | float | None = None):
    """Clipped value loss of PPO (Schulman et al. 2017, arXiv:1707.06347; as in OpenAI baselines)::

        v_clip = clip(vpreds, values - cliprange_value, values + cliprange_value)
        loss   = 0.5 * agg(max((vpreds - returns)^2, (v_clip - returns)^2))

    Args:
        vpreds: ``[batch, response_len]`` current value predictions.
        returns: ``[batch, response_len]`` value targets.
        values: ``[batch, response_len]`` value predictions at rollout time (the clip centre).
        response_mask: ``[batch, response_len]``.
        cliprange_value: clip range of the value update.
        loss_agg_mode: see ``agg_loss``.
        dp_size, batch_num_tokens, global_batch_size, loss_scale_factor: passed to ``agg_loss``
            (normalisation over data-parallel ranks and the ``seq-mean-token-sum-norm`` constant).

    Returns:
        ``(vf_loss, vf_clipfrac)``: the 0-dim loss, and the fraction of valid tokens where the
        clipped error was the larger one.
    """
    vpreds, returns, values = vpreds.float(), returns.float(), values.float()
    vpred_clipped = clip_by_value(vpreds, values - cliprange_value, values + cliprange_value)
    loss_unclipped = (vpreds - returns).square()
    loss_clipped = (vpred_clipped - returns).square()
    vf_loss = 0.5 * agg_loss(torch.maximum(loss_unclipped, loss_clipped), response_mask, loss_agg_mode,
                             dp_size, batch_num_tokens, global_batch_size, loss_scale_factor)
    vf_clipfrac = masked_mean((loss_clipped > loss_unclipped).float(), response_mask)
    return vf_loss, vf_clipfrac
