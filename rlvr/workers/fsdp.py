"""FSDP2 sharding, optimizer and schedule builders, and CPU offload helpers for the workers.

With one rank (the local backend, or a Ray group of one) the module stays a plain ``nn.Module``
and no process group is needed. With several ranks every decoder layer and then the root are
wrapped with ``torch.distributed.fsdp.fully_shard`` over a 1-D device mesh (gloo on CPU, NCCL on
GPU): parameters are sharded, all-gathered for each forward/backward, and gradients are
reduce-scattered (averaged over ranks).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from transformers import PreTrainedModel

from rlvr.workers.batching import all_reduce_sum, loss_share

__all__ = [
    "shard_module",
    "build_optimizer",
    "build_lr_scheduler",
    "clip_grad_norm",
    "accumulate_and_step",
    "full_parameters",
    "full_state_dict",
    "load_full_state_dict",
    "full_optimizer_state_dict",
    "load_full_optimizer_state_dict",
    "move_module",
    "move_optimizer_state",
]


def _layer_class_names(module: nn.Module) -> set[str]:
    """Class names of the transformer blocks (``_no_split_modules`` of every HF model inside)."""
    names: set[str] = set()
    for sub in module.modules():
        if isinstance(sub, PreTrainedModel):
            names.update(sub._no_split_modules or [])
    return names


def shard_module(module: nn.Module, world_size: int, device_type: str, reshard_after_forward: bool) -> nn.Module:
    """Wrap ``module`` with FSDP2 over all ranks of the default process group.

    Each transformer block becomes its own FSDP unit (all-gathered one at a time), the root holds
    the rest (embeddings, final norm, heads). With ``world_size == 1`` the module is returned
    unchanged. The module must already be on its device and identical on every rank.

    Args:
        module: the model (a HF ``PreTrainedModel``, a peft model, or a module containing one).
        world_size: ranks in the group.
        device_type: ``"cpu"`` or ``"cuda"``.
        reshard_after_forward: free the gathered parameters after each block's forward.
    """
    if world_size == 1:
        return module
    if not dist.is_initialized():
        raise RuntimeError(
            f"sharding over {world_size} ranks needs torch.distributed; call the worker's "
            "init_process_group() first"
        )
    mesh = init_device_mesh(device_type, (world_size,))
    layer_names = _layer_class_names(module)
    if not layer_names:
        raise ValueError(f"{type(module).__name__} declares no transformer block class (_no_split_modules)")
    for sub in list(module.modules()):
        if type(sub).__name__ in layer_names:
            fully_shard(sub, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(module, mesh=mesh, reshard_after_forward=reshard_after_forward)
    return module


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


def clip_grad_norm(module: nn.Module, max_norm: float) -> float:
    """Clip the global gradient norm (over all shards) to ``max_norm``; returns the norm before
    clipping (``inf``/``nan`` when a gradient is not finite; nothing is clipped then)."""
    params = [p for p in module.parameters() if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm, error_if_nonfinite=False, foreach=True)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    return float(norm)


def accumulate_and_step(
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    mini: dict[str, torch.Tensor],
    micro_batches: list[list[int]],
    micro_loss: Callable[[dict[str, torch.Tensor]], tuple[torch.Tensor, torch.Tensor]],
    num_metrics: int,
    *,
    loss_agg_mode: str,
    grad_clip: float,
    world_size: int,
    device: torch.device,
) -> tuple[torch.Tensor, float, bool]:
    """One optimizer step over a mini-batch: gradient accumulation over its micro-batches, a
    clipped step, and the step skipped when the gradient norm is not finite.

    Each micro-batch loss is weighted by :func:`~rlvr.workers.batching.loss_share` so that the
    accumulated gradient equals that of the mini-batch loss aggregated over all ranks.

    Args:
        mini: the mini-batch, tensors ``[b, ...]`` with ``response_mask [b, R]`` (on any device).
        micro_batches: row indices of ``mini`` per micro-batch.
        micro_loss: ``micro -> (loss, metrics [num_metrics])``; ``micro`` is on ``device``.
        num_metrics: length of the metric vector ``micro_loss`` returns.

    Returns:
        ``(metric sums [num_metrics] (float64, CPU, share-weighted and summed over ranks),
        grad norm before clipping, whether the step was taken)``.
    """
    mask = mini["response_mask"]
    counts = torch.tensor([float(mask.sum()), float((mask.sum(-1) > 0).sum())], dtype=torch.float64)
    global_tokens, global_seqs = all_reduce_sum(counts.to(device), world_size).tolist()
    sums = torch.zeros(num_metrics, dtype=torch.float64)
    optimizer.zero_grad(set_to_none=True)
    for idx in micro_batches:
        index = torch.tensor(idx)
        micro = {key: value[index].to(device) for key, value in mini.items()}
        share = loss_share(micro["response_mask"], global_tokens, global_seqs, loss_agg_mode, world_size)
        loss, values = micro_loss(micro)
        (loss * share).backward()
        sums += values.double() * (share / world_size)
    grad_norm = clip_grad_norm(module, grad_clip)
    finite = bool(torch.isfinite(torch.tensor(grad_norm)))
    if finite:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return all_reduce_sum(sums.to(device), world_size).cpu(), grad_norm, finite


def full_parameters(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, full tensor)`` for every parameter, all-gathering the FSDP2 shards one at a time
    (a collective per parameter: every rank must iterate in step)."""
    for name, param in module.named_parameters():
        data = param.data
        yield name, data.full_tensor() if isinstance(data, DTensor) else data


def _options(world_size: int, **kwargs) -> StateDictOptions:
    return StateDictOptions(full_state_dict=True, cpu_offload=world_size > 1, **kwargs)


def full_state_dict(module: nn.Module, world_size: int) -> dict[str, torch.Tensor]:
    """The unsharded model state dict on rank 0 (CPU); empty on the other ranks (collective)."""
    return get_model_state_dict(module, options=_options(world_size))


def load_full_state_dict(module: nn.Module, state: dict[str, torch.Tensor], world_size: int) -> None:
    """Load a full state dict read on rank 0 (other ranks pass ``{}``) into a possibly sharded model."""
    set_model_state_dict(module, state, options=_options(world_size, broadcast_from_rank0=world_size > 1))


def full_optimizer_state_dict(module: nn.Module, optimizer: torch.optim.Optimizer, world_size: int) -> dict:
    """The unsharded optimizer state (keyed by parameter names) on rank 0; empty elsewhere."""
    return get_optimizer_state_dict(module, optimizer, options=_options(world_size))


def load_full_optimizer_state_dict(module: nn.Module, optimizer: torch.optim.Optimizer, state: dict,
                                   world_size: int) -> None:
    """Load an optimizer state from :func:`full_optimizer_state_dict` (rank 0 holds it)."""
    options = _options(world_size, broadcast_from_rank0=world_size > 1)
    set_optimizer_state_dict(module, optimizer, state, options=options)


def move_module(module: nn.Module, device: str | torch.device) -> None:
    """Move parameters and buffers (sharded or not) to ``device`` in place."""
    module.to(device)


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: str | torch.device) -> None:
    """Move the optimizer's state tensors (Adam moments) to ``device`` in place."""
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and key != "step":
                state[key] = value.to(device)
