"""Core functions of PPO-like algorithms (the public entry point; pure torch, CPU-testable).

The code lives in small modules and is re-exported here under verl's names:

- ``rlvr.trainer.ppo.policy_loss``: ``agg_loss``, ``compute_policy_loss``, the policy-loss
  registry (``register_policy_loss``, ``get_policy_loss_fn``, ``PolicyLossConfig``).
- ``rlvr.trainer.ppo.advantage``: the advantage-estimator registry (``AdvantageEstimator``,
  ``register_adv_est``, ``get_adv_estimator_fn``, ``AdvantageConfig``) and the estimators.
- ``rlvr.trainer.ppo.egpo``: the EGPO calibration math.
- ``rlvr.trainer.ppo.kl``: ``kl_penalty`` and the KL-coefficient controllers.
- ``rlvr.utils.torch_functional``: ``masked_mean``, ``masked_whiten``, ``entropy_from_logits``.

This module adds the clipped value loss.
"""

from __future__ import annotations

import torch

from rlvr.trainer.ppo.advantage import (
    ADV_ESTIMATOR_REGISTRY,
    AdvantageConfig,
    AdvantageEstimator,
    compute_egpo_outcome_advantage,
    compute_gae_advantage_return,
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage,
    get_adv_estimator_fn,
    register_adv_est,
)
from rlvr.trainer.ppo.kl import (
    AdaptiveKLController,
    FixedKLController,
    KLControlConfig,
    get_kl_controller,
    kl_penalty,
)
from rlvr.trainer.ppo.policy_loss import (
    AGG_LOSS_MODES,
    POLICY_LOSS_REGISTRY,
    PolicyLossConfig,
    agg_loss,
    compute_policy_loss,
    compute_policy_loss_cispo,
    compute_policy_loss_clip_cov,
    compute_policy_loss_geo_mean,
    compute_policy_loss_gpg,
    compute_policy_loss_gspo,
    compute_policy_loss_kl_cov,
    compute_policy_loss_vanilla,
    get_policy_loss_fn,
    register_policy_loss,
)
from rlvr.utils.torch_functional import entropy_from_logits, masked_mean, masked_whiten

__all__ = [
    "ADV_ESTIMATOR_REGISTRY", "AGG_LOSS_MODES", "POLICY_LOSS_REGISTRY", "AdaptiveKLController",
    "AdvantageConfig", "AdvantageEstimator", "FixedKLController", "KLControlConfig", "PolicyLossConfig",
    "agg_loss", "compute_egpo_outcome_advantage", "compute_gae_advantage_return",
    "compute_gpg_outcome_advantage", "compute_grpo_outcome_advantage", "compute_opo_outcome_advantage",
    "compute_policy_loss", "compute_policy_loss_cispo", "compute_policy_loss_clip_cov",
    "compute_policy_loss_geo_mean", "compute_policy_loss_gpg", "compute_policy_loss_gspo",
    "compute_policy_loss_kl_cov", "compute_policy_loss_vanilla",
    "compute_reinforce_plus_plus_baseline_outcome_advantage", "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage", "compute_rloo_outcome_advantage", "compute_value_loss",
    "entropy_from_logits", "get_adv_estimator_fn", "get_kl_controller", "get_policy_loss_fn", "kl_penalty",
    "masked_mean", "masked_whiten", "register_adv_est", "register_policy_loss",
]


def compute_value_loss(vpreds: torch.Tensor, returns: torch.Tensor, values: torch.Tensor,
                       response_mask: torch.Tensor, cliprange_value: float, loss_agg_mode: str = "token-mean"):
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

    Returns:
        ``(vf_loss, vf_clipfrac)``: the 0-dim loss, and the fraction of valid tokens where the
        clipped error was the larger one.
    """
    vpreds, returns, values = vpreds.float(), returns.float(), values.float()
    vpred_clipped = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)
    loss_unclipped = (vpreds - returns).square()
    loss_clipped = (vpred_clipped - returns).square()
    vf_loss = 0.5 * agg_loss(torch.maximum(loss_unclipped, loss_clipped), response_mask, loss_agg_mode)
    vf_clipfrac = masked_mean((loss_clipped > loss_unclipped).float(), response_mask)
    return vf_loss, vf_clipfrac
