"""The ``clipped_reinforce`` policy loss."""

from __future__ import annotations

from typing import Any

import torch

from rlvr.trainer.ppo.policy_loss import agg_loss, register_policy_loss
from rlvr.utils.torch_functional import masked_mean


@register_policy_loss("clipped_reinforce")
def compute_clipped_reinforce_loss(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                                   response_mask: torch.Tensor, loss_agg_mode: str = "token-mean", config: Any = None,
                                   rollout_is_weights: torch.Tensor | None = None):
    """REINFORCE with a clipped importance weight that carries no gradient (all ``[batch, response_len]``)::

        loss_t = -sg(clip(r_t, 1 - eps, 1 + eps)) * A_t * log_prob_t,   r_t = exp(log_prob_t - old_log_prob_t)

    with ``eps = actor.clip_ratio``: every token keeps a gradient, its weight is bounded.
    """
    eps = 0.2 if config is None else float(config.clip_ratio)
    ratio = torch.exp((log_prob - old_log_prob).clamp(-20.0, 20.0))
    weight = ratio.clamp(1 - eps, 1 + eps).detach()
    if rollout_is_weights is not None:
        weight = weight * rollout_is_weights.detach()
    loss = agg_loss(-weight * advantages * log_prob, response_mask, loss_agg_mode)
    clipped = ((ratio < 1 - eps) | (ratio > 1 + eps)).float()
    return loss, {"pg_loss": loss.detach(), "pg_clipfrac": masked_mean(clipped, response_mask).detach(),
                  "ppo_kl": masked_mean(old_log_prob - log_prob, response_mask).detach(),
                  "pg_clipfrac_lower": torch.zeros((), device=loss.device)}
