"""``rollout/moe/*``: how evenly a mixture-of-experts rollout spread its tokens over the experts.

From the rollout's ``routed_experts`` (``rollout.enable_rollout_routing_replay``), counted over the
sampled response tokens whose route is known (the last sampled token of a row, which no decode step
fed, has none), accumulated over ``rollout.moe_load_balance_metrics_interval`` steps and logged every
that many steps, with verl's names: for MoE layer ``i``, with ``q_e`` the share of the layer's top-k
choices that went to expert ``e`` and ``E`` experts, the violation ``v_e = E * q_e - 1`` (0 when
perfectly balanced): ``rollout/moe/max_vio/layer_<i>`` (``max_e v_e``), ``min_vio`` (``min_e v_e``),
``avg_vio`` (``mean_e |v_e|``), each also as ``/max`` and ``/avg`` over the layers, and
``rollout/moe/routed_expert_assignments`` (choices counted) and ``routed_experts_found``.
"""

from __future__ import annotations

import torch

__all__ = ["RolloutMoeMetrics", "load_violation_metrics", "rollout_expert_counts"]

PREFIX = "rollout/moe"


def rollout_expert_counts(routed_experts: torch.Tensor, response_mask: torch.Tensor, num_experts: int) -> torch.Tensor:
    """``[layers, E]`` int64 choices per expert over the sampled response tokens with a known route.

    Args:
        routed_experts: ``[B, P+R, layers, k]`` (``-1`` = unknown).
        response_mask: ``[B, R]``.
        num_experts: ``E``.
    """
    responses = routed_experts[:, -response_mask.shape[1]:].long()
    known = response_mask.bool() & (responses >= 0).all(-1).all(-1)
    chosen = responses[known]  # [tokens, layers, k]
    return torch.stack([torch.bincount(chosen[:, layer].flatten(), minlength=num_experts)
                        for layer in range(chosen.shape[1])])


def load_violation_metrics(counts: torch.Tensor) -> dict[str, float]:
    """The violation metrics of ``counts [layers, E]`` (module docstring)."""
    share = counts.double() / counts.sum(-1, keepdim=True).clamp(min=1)
    violation = share * counts.shape[1] - 1.0
    stats = {"max_vio": violation.amax(-1), "min_vio": violation.amin(-1), "avg_vio": violation.abs().mean(-1)}
    metrics = {}
    for name, per_layer in stats.items():
        metrics.update({f"{PREFIX}/{name}/layer_{i}": float(v) for i, v in enumerate(per_layer)})
        metrics[f"{PREFIX}/{name}/max"] = float(per_layer.max())
        metrics[f"{PREFIX}/{name}/avg"] = float(per_layer.mean())
    return metrics


class RolloutMoeMetrics:
    """Accumulates the rollout's expert counts and logs them every ``interval`` steps (0: never).

    Args:
        interval: ``rollout.moe_load_balance_metrics_interval``.
    """

    def __init__(self, interval: int) -> None:
        self.interval = int(interval)
        self.counts: torch.Tensor | None = None

    def update(self, routed_experts: torch.Tensor, response_mask: torch.Tensor, num_experts: int,
               step: int) -> dict[str, float]:
        """Add one step's batch; at every ``interval``-th step return the metrics and start again."""
        if self.interval <= 0:
            return {}
        counts = rollout_expert_counts(routed_experts, response_mask, num_experts)
        self.counts = counts if self.counts is None else self.counts + counts
        if step % self.interval:
            return {}
        counts, self.counts = self.counts, None
        assignments = int(counts.sum())
        return {**load_violation_metrics(counts), f"{PREFIX}/routed_expert_assignments": float(assignments),
                f"{PREFIX}/routed_experts_found": float(assignments > 0)}
