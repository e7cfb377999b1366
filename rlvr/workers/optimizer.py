"""The optimizer (AdamW) and the learning-rate schedule of a trained model."""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["build_lr_scheduler", "build_optimizer"]


def build_optimizer(module: nn.Module, optim_config) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters (``optim_config``: lr, betas, eps, weight_decay)."""
    params = [p for p in module.parameters() if p.requires_grad]
    if not params:
        raise ValueError(f"{type(module).__name__} has no trainable parameter")
    return torch.optim.AdamW(
        params,
        lr=optim_config.lr,
        betas=tuple(optim_config.betas),
        eps=optim_config.eps,
        weight_decay=optim_config.weight_decay,
    )


def build_lr_scheduler(optimizer: torch.optim.Optimizer, optim_config) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup then a constant or cosine schedule, stepped once per training step.

    ``warmup_steps`` (when > 0) or ``warmup_steps_ratio x total_training_steps`` warm up linearly
    from ``lr / warmup`` to ``lr``; cosine then decays to ``min_lr_ratio x lr`` at
    ``total_training_steps`` (which must then be set, > 0).
    """
    total = int(optim_config.total_training_steps)
    warmup = int(optim_config.warmup_steps)
    if warmup <= 0 and optim_config.warmup_steps_ratio > 0:
        if total <= 0:
            raise ValueError("optim.warmup_steps_ratio needs optim.total_training_steps > 0 (the trainer sets it)")
        warmup = int(optim_config.warmup_steps_ratio * total)
    kind = optim_config.lr_scheduler_type
    if kind not in ("constant", "cosine"):
        raise ValueError(f"optim.lr_scheduler_type must be 'constant' or 'cosine', got {kind!r}")
    if kind == "cosine" and total <= 0:
        raise ValueError("the cosine schedule needs optim.total_training_steps > 0 (the trainer sets it)")
    floor = float(optim_config.min_lr_ratio)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if kind == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
