"""The optimizer, the learning-rate schedule and the gradient clip of a trained model (a role's
``optim`` section, verl's keys).

The optimizer is ``optim.optimizer`` from the module ``optim.optimizer_impl`` (AdamW from
``torch.optim`` by default; Megatron's ``adam`` is AdamW), built as verl builds it: ``lr`` and
``weight_decay``, ``betas`` (and rlvr's ``eps``) for Adam-like classes, then
``override_optimizer_config``.

The schedule is stepped once per training step; factor ``f(step)`` multiplies ``lr``:

- ``lr_decay_style`` unset (verl's FSDP engine): linear warmup over ``warmup_steps`` (or
  ``warmup_steps_ratio x total_training_steps``) from 0, then ``lr_scheduler_type`` ``constant``, or
  ``cosine`` decaying to ``min_lr_ratio`` over ``num_cycles`` waves:
  ``max(m, m + (1 - m) * 0.5 * (1 + cos(2 pi num_cycles p)))``, ``p`` the share of the steps after
  warmup. ``zero_indexed_step`` is verl's step counting: True counts from 0 (the first warmup step
  has lr 0), False from 1 (warmup and decay one step later); None, rlvr's default, starts the warmup
  at ``lr / warmup`` and the decay at the end of the warmup.
- ``lr_decay_style`` set (Megatron's ``OptimizerParamScheduler``): warmup from ``lr_warmup_init`` to
  ``lr`` over ``warmup_steps``, then ``constant`` | ``linear`` | ``cosine`` | ``inverse-square-root``
  | ``WSD`` decay to ``min_lr`` at ``lr_decay_steps`` (None: ``total_training_steps``), ``min_lr``
  after it; WSD stays at ``lr`` until the last ``lr_wsd_decay_steps`` and anneals then
  (``lr_wsd_decay_style``).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable

import torch
from torch import nn

__all__ = ["build_lr_scheduler", "build_optimizer", "lr_factor", "max_grad_norm"]

_MEGATRON_NAMES = {"adam": "AdamW"}
"""Megatron's optimizer names in ``torch.optim`` (its ``adam`` decouples weight decay, as AdamW)."""


def build_optimizer(module: nn.Module, optim_config) -> torch.optim.Optimizer:
    """The optimizer over the trainable parameters (see the module docstring).

    Raises:
        ValueError: no trainable parameter, or the optimizer class cannot be found.
    """
    params = [p for p in module.parameters() if p.requires_grad]
    if not params:
        raise ValueError(f"{type(module).__name__} has no trainable parameter")
    name = str(optim_config.optimizer)
    impl = str(optim_config.optimizer_impl)
    if impl == "torch.optim":
        name = _MEGATRON_NAMES.get(name, name)
    try:
        optimizer_cls = getattr(importlib.import_module(impl), name)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"optim.optimizer={optim_config.optimizer!r} in optim.optimizer_impl={impl!r} cannot be "
                         f"loaded ({err}); name a class of that module, e.g. AdamW in torch.optim") from None
    kwargs = {"lr": optim_config.lr, "weight_decay": optim_config.weight_decay}
    if "adam" in name.lower():
        kwargs.update(betas=tuple(optim_config.betas), eps=optim_config.eps)
    kwargs.update(dict(optim_config.override_optimizer_config or {}))
    return optimizer_cls(params, **kwargs)


def max_grad_norm(role_config) -> float:
    """The gradient clip of a role (``actor`` or ``critic`` section): verl's ``optim.clip_grad`` when
    set, else rlvr's ``grad_clip``."""
    clip = role_config.optim.clip_grad
    return float(role_config.grad_clip if clip is None else clip)


def _warmup_steps(optim_config, total: int) -> int:
    warmup = int(optim_config.warmup_steps)
    if warmup <= 0 and optim_config.warmup_steps_ratio > 0:
        if total <= 0:
            raise ValueError("optim.warmup_steps_ratio needs optim.total_training_steps > 0 (the trainer sets it)")
        warmup = int(optim_config.warmup_steps_ratio * total)
    return warmup


def _fsdp_factor(optim_config, total: int, warmup: int) -> Callable[[int], float]:
    kind = optim_config.lr_scheduler_type or "constant"
    if kind not in ("constant", "cosine"):
        raise ValueError(f"optim.lr_scheduler_type must be 'constant' or 'cosine', got {kind!r}")
    if kind == "cosine" and total <= 0:
        raise ValueError("the cosine schedule needs optim.total_training_steps > 0 (the trainer sets it)")
    floor = float(optim_config.min_lr_ratio or 0.0)
    cycles, counting = float(optim_config.num_cycles), optim_config.zero_indexed_step

    def factor(step: int) -> float:
        if counting is None and step < warmup:  # rlvr's own: the first warmup step has lr / warmup
            return (step + 1) / warmup
        step = step if counting is None or counting else step + 1
        if step < warmup:
            return step / max(1, warmup)
        if kind == "constant":
            return 1.0
        progress = (step - warmup) / max(1, total - warmup)
        return max(floor, floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(2.0 * math.pi * cycles * progress)))

    return factor


def _megatron_factor(optim_config, total: int, warmup: int) -> Callable[[int], float]:
    style, peak = optim_config.lr_decay_style, float(optim_config.lr)
    low, start = float(optim_config.min_lr), float(optim_config.lr_warmup_init)
    decay_steps = int(optim_config.lr_decay_steps or total)
    wsd_steps = optim_config.lr_wsd_decay_steps
    if style != "constant" and decay_steps <= warmup:
        raise ValueError(f"optim.lr_decay_style={style} needs lr_decay_steps (or total_training_steps) > the warmup "
                         f"steps ({warmup}), got {decay_steps}")
    if style == "WSD" and not wsd_steps:
        raise ValueError("optim.lr_decay_style=WSD needs optim.lr_wsd_decay_steps (the steps of the final decay)")

    def coefficient(step: int) -> float:
        ratio = (step - warmup) / (decay_steps - warmup)
        if style == "linear":
            return 1.0 - ratio
        if style == "cosine":
            return 0.5 * (math.cos(math.pi * ratio) + 1.0)
        anneal_start = decay_steps - int(wsd_steps)
        if step <= anneal_start:
            return 1.0
        wsd = (step - anneal_start) / int(wsd_steps)
        return {"linear": 1.0 - wsd, "cosine": 0.5 * (math.cos(math.pi * wsd) + 1.0),
                "exponential": 2.0 * 0.5 ** wsd - 1.0, "minus_sqrt": 1.0 - math.sqrt(wsd)}[
            optim_config.lr_wsd_decay_style]

    def lr(step: int) -> float:
        if warmup > 0 and step <= warmup:
            return start + (peak - start) * step / warmup
        if style == "constant":
            return peak
        if step > decay_steps:
            return low
        if style == "inverse-square-root":
            return max(low, peak * max(warmup, 1) ** 0.5 / max(step, 1) ** 0.5)
        return low + coefficient(step) * (peak - low)

    return lambda step: lr(step) / peak if peak > 0 else 0.0


def lr_factor(optim_config) -> Callable[[int], float]:
    """The schedule's ``step -> lr multiplier`` (see the module docstring)."""
    total = int(optim_config.total_training_steps)
    warmup = _warmup_steps(optim_config, total)
    if optim_config.lr_decay_style is not None:
        return _megatron_factor(optim_config, total, warmup)
    return _fsdp_factor(optim_config, total, warmup)


def build_lr_scheduler(optimizer: torch.optim.Optimizer, optim_config) -> torch.optim.lr_scheduler.LambdaLR:
    """The learning-rate schedule of ``optim_config`` (see the module docstring), stepped once per
    training step."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(optim_config))
