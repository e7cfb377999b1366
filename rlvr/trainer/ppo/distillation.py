"""On-policy distillation losses (verl 0.9's ``distillation.distillation_loss``), pure torch.

The student samples; a frozen teacher scores the student's own samples (Agarwal et al. 2024,
"On-Policy Distillation of Language Models: Learning from Self-Generated Mistakes",
arXiv:2306.13649; Lu & Thinking Machines 2025, "On-Policy Distillation"). Per response token t:

- **KL estimators** (``k1``/``kl``, ``abs``, ``k2``/``mse``, ``k3``/``low_var_kl``) of KL(student ||
  teacher) from the sampled token's log-probs, ``s_t`` (student, at the sampling temperature) and
  ``q_t`` (teacher, untempered): :func:`~rlvr.trainer.ppo.kl.kl_penalty` with ``logprob=s``,
  ``ref_logprob=q``; ``k3 = exp(q - s) - (q - s) - 1``, with ``q - s`` clamped to ±20 and the result
  to ±10 (Schulman, "Approximating KL divergence", 2020).
- **forward_kl_topk**: KL(teacher || student) over the teacher's top-k tokens ``V_t`` at position
  t: ``sum_{v in V_t} exp(q_v) * (q_v - s_v)``, both log-probs first clamped from below by
  ``log_prob_min_clamp`` (when set), and the result clamped at 0 (the top-k masses do not sum to 1,
  so the sum may be negative). The masses ``sum_{v in V_t} exp(.)`` of both are logged.

Then, per token, the loss is clamped to ``[-loss_max_clamp, loss_max_clamp]`` (when set) and

- ``use_policy_gradient=false``: aggregated with the actor's ``loss_agg_mode`` and backpropagated
  directly;
- ``use_policy_gradient=true``: ``-loss`` (detached) is the advantage of the clipped policy-gradient
  loss ``policy_loss_mode`` (vanilla) with the distillation section's clip ratios.

Combined with the task rewards' policy loss ``L_pg``: ``L_pg + distillation_loss_coef * L_distill``
with ``use_task_rewards``, else ``L_distill`` alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from rlvr.trainer.ppo.distillation_config import ESTIMATOR_LOSS_MODES, TOPK_LOSS_MODES
from rlvr.trainer.ppo.core_algos import agg_loss, get_policy_loss_fn, kl_penalty
from rlvr.utils.registry import Registry
from rlvr.utils.torch_functional import masked_mean

__all__ = [
    "TEACHER_LOG_PROBS",
    "TEACHER_TOPK_LOG_PROBS",
    "TEACHER_TOPK_IDS",
    "DistillationLossSettings",
    "DISTILLATION_LOSS_REGISTRY",
    "register_distillation_loss",
    "get_distillation_loss",
    "TeacherScores",
    "distillation_metric_names",
    "distillation_token_losses",
    "distillation_loss",
    "combine_with_policy_loss",
]

TEACHER_LOG_PROBS = "teacher_log_probs"
"""Batch key: ``[B, R]`` the teacher's log-prob of each sampled token (untempered)."""
TEACHER_TOPK_LOG_PROBS = "teacher_topk_log_probs"
"""Batch key: ``[B, R, K]`` the teacher's top-k log-probs at each response position."""
TEACHER_TOPK_IDS = "teacher_topk_ids"
"""Batch key: ``[B, R, K]`` the token ids of those top-k log-probs."""

TokenLossFn = Callable[["TeacherScores", Any], "tuple[torch.Tensor, dict[str, torch.Tensor]]"]
"""``(scores, loss_config) -> (losses [B, R], per-token diagnostics name -> [B, R])``."""


@dataclass(frozen=True)
class DistillationLossSettings:
    """What a registered distillation loss reads (the metadata of its registry entry)."""

    uses_topk: bool = False
    """the teacher's top-k log-probs and ids at every response position (else the sampled tokens' log-probs)."""
    diagnostics: tuple[str, ...] = ()
    """the names of the per-token diagnostics the loss returns (logged as ``distillation/<name>``)."""


DISTILLATION_LOSS_REGISTRY: Registry[TokenLossFn] = Registry("distillation loss", DistillationLossSettings)


def register_distillation_loss(*names: str, uses_topk: bool = False, diagnostics: tuple[str, ...] = ()
                               ) -> Callable[[TokenLossFn], TokenLossFn]:
    """Register a per-token loss under every name of ``names`` (a name taken by another loss raises)."""

    def add(fn: TokenLossFn) -> TokenLossFn:
        for name in names:
            DISTILLATION_LOSS_REGISTRY.add(name, fn, uses_topk=uses_topk, diagnostics=diagnostics)
        return fn

    return add


def get_distillation_loss(name: str) -> tuple[TokenLossFn, DistillationLossSettings]:
    """The loss registered as ``name`` (or at an object path) and its settings; a miss lists the valid names."""
    return DISTILLATION_LOSS_REGISTRY[name], DISTILLATION_LOSS_REGISTRY.metadata(name)


@dataclass
class TeacherScores:
    """The student's and the teacher's log-probs of one micro-batch.

    Attributes:
        loss_mode: the registered loss name (the KL estimator's name for the estimator losses).
        student_log_probs: ``[B, R]`` of the sampled tokens (with gradient).
        teacher_log_probs: ``[B, R]`` of the sampled tokens (estimator losses).
        student_topk_log_probs: ``[B, R, K]`` of the teacher's top-k tokens (with gradient; topk losses).
        teacher_topk_log_probs: ``[B, R, K]`` (topk losses).
    """

    loss_mode: str
    student_log_probs: torch.Tensor
    teacher_log_probs: torch.Tensor | None = None
    student_topk_log_probs: torch.Tensor | None = None
    teacher_topk_log_probs: torch.Tensor | None = None


@register_distillation_loss(*ESTIMATOR_LOSS_MODES, diagnostics=("abs_loss",))
def kl_estimator_loss(scores: TeacherScores, loss_config: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The KL estimator ``loss_mode`` of KL(student || teacher) on the sampled tokens ``[B, R]``."""
    losses = kl_penalty(scores.student_log_probs, scores.teacher_log_probs, scores.loss_mode)
    return losses, {"abs_loss": losses.detach().abs()}


@register_distillation_loss(*TOPK_LOSS_MODES, uses_topk=True, diagnostics=("student_mass", "teacher_mass"))
def forward_kl_topk_loss(scores: TeacherScores, loss_config: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """KL(teacher || student) over the teacher's top-k tokens ``[B, R]`` (module docstring)."""
    student, teacher = scores.student_topk_log_probs.float(), scores.teacher_topk_log_probs.float()
    diagnostics = {"student_mass": student.detach().exp().sum(-1), "teacher_mass": teacher.exp().sum(-1)}
    if loss_config.log_prob_min_clamp is not None:
        student = student.clamp_min(loss_config.log_prob_min_clamp)
        teacher = teacher.clamp_min(loss_config.log_prob_min_clamp)
    losses = (teacher.exp() * (teacher - student)).sum(-1)
    return losses.clamp_min(0.0), diagnostics


def distillation_metric_names(loss_config: Any) -> list[str]:
    """The metric names :func:`distillation_loss` returns for ``loss_config``, in a fixed order."""
    names = ["distillation/loss", *(f"distillation/{d}" for d in get_distillation_loss(loss_config.loss_mode)[1].diagnostics)]
    return names + (["distillation/pg_clipfrac"] if loss_config.use_policy_gradient else [])


def distillation_token_losses(scores: TeacherScores, loss_config: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token losses ``[B, R]`` of ``loss_config.loss_mode`` after ``loss_max_clamp``, and the
    loss's per-token diagnostics (before the clamp)."""
    losses, diagnostics = get_distillation_loss(loss_config.loss_mode)[0](scores, loss_config)
    if loss_config.loss_max_clamp is not None:
        losses = losses.clamp(min=-loss_config.loss_max_clamp, max=loss_config.loss_max_clamp)
    return losses, diagnostics


def distillation_loss(scores: TeacherScores, loss_config: Any, response_mask: torch.Tensor, loss_agg_mode: str,
                      old_log_prob: torch.Tensor | None = None, rollout_is_weights: torch.Tensor | None = None,
                      global_batch_info: dict | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The micro-batch's distillation loss (a scalar) and its metrics (0-dim tensors, means over
    the valid tokens).

    Args:
        scores: the micro-batch's log-probs.
        loss_config: ``distillation.distillation_loss``.
        response_mask: ``[B, R]`` tokens that count.
        loss_agg_mode: the actor's aggregation.
        old_log_prob: ``[B, R]`` behaviour log-probs (``use_policy_gradient``).
        rollout_is_weights: ``[B, R]`` off-policy weights of the policy-gradient form (optional).
        global_batch_info: ``agg_loss``'s global normalisers (``{}``: per micro-batch).

    Returns:
        ``(loss, {"distillation/loss": per-token mean, "distillation/<diagnostic>": means,
        "distillation/pg_clipfrac": ... with use_policy_gradient})``.
    """
    losses, diagnostics = distillation_token_losses(scores, loss_config)
    metrics = {f"distillation/{name}": masked_mean(value, response_mask) for name, value in diagnostics.items()}
    metrics["distillation/loss"] = masked_mean(losses.detach(), response_mask)
    if loss_config.use_policy_gradient:
        clip = {"clip_ratio": loss_config.clip_ratio, "clip_ratio_low": loss_config.clip_ratio_low,
                "clip_ratio_high": loss_config.clip_ratio_high, "global_batch_info": dict(global_batch_info or {})}
        loss, pg_metrics = get_policy_loss_fn(loss_config.policy_loss_mode)(
            old_log_prob=old_log_prob, log_prob=scores.student_log_probs, advantages=-losses.detach(),
            response_mask=response_mask, loss_agg_mode=loss_agg_mode, config=clip,
            rollout_is_weights=rollout_is_weights)
        metrics["distillation/pg_clipfrac"] = pg_metrics["pg_clipfrac"]
        return loss, metrics
    return agg_loss(losses, response_mask, loss_agg_mode, **(global_batch_info or {})), metrics


def combine_with_policy_loss(policy_loss: torch.Tensor, distill_loss: torch.Tensor, loss_config: Any) -> torch.Tensor:
    """``policy_loss + distillation_loss_coef * distill_loss`` with ``use_task_rewards``, else
    ``distill_loss`` alone."""
    if not loss_config.use_task_rewards:
        return distill_loss
    return policy_loss + loss_config.distillation_loss_coef * distill_loss
