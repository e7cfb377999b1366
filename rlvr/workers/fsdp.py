"""FSDP2 sharding for the workers: wrapping, the gradient norm over shards, full (unsharded) weights
and states, and moving a model and its optimizer state between devices (offload).

With one rank (the local backend, or a Ray group of one) the module stays a plain ``nn.Module``
and no process group is needed. With several ranks every decoder layer and then the root are
wrapped with ``torch.distributed.fsdp.fully_shard`` over a 1-D device mesh (gloo on CPU, NCCL on
GPU): parameters are sharded, all-gathered for each forward/backward, and gradients are
reduce-scattered (averaged over ranks).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

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
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor
from transformers import PreTrainedModel

if TYPE_CHECKING:
    from rlvr.trainer.config.schema import RefFSDPConfig, RefMegatronConfig

__all__ = [
    "shard_module",
    "shard_role_module",
    "fsdp_wrap",
    "fsdp_options",
    "compute_dtype",
    "clip_grad_norm",
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


def shard_module(module: nn.Module, world_size: int, device_type: str, reshard_after_forward: bool, *,
                 offload_policy: bool = False, forward_prefetch: bool = False,
                 param_dtype: torch.dtype | None = None) -> nn.Module:
    """Wrap ``module`` with FSDP2 over all ranks of the default process group.

    Each transformer block becomes its own FSDP unit (all-gathered one at a time), the root holds
    the rest (embeddings, final norm, heads). With ``world_size == 1`` the module is returned
    unchanged. The module must already be on its device and identical on every rank.

    Args:
        module: the model (a HF ``PreTrainedModel``, a peft model, or a module containing one).
        world_size: ranks in the group.
        device_type: ``"cpu"`` or ``"cuda"``.
        reshard_after_forward: free the gathered parameters after each block's forward.
        offload_policy: FSDP2's ``CPUOffloadPolicy``: the sharded parameters, their gradients and
            the optimizer state stay on CPU, each unit is copied to the device for its compute.
        forward_prefetch: each block all-gathers the next block's parameters as it starts.
        param_dtype: mixed precision: the dtype blocks compute in (parameters keep theirs;
            gradients are reduced in float32); None = the parameters' dtype.
    """
    if world_size == 1:
        return module
    if not dist.is_initialized():
        raise RuntimeError(
            f"sharding over {world_size} ranks needs torch.distributed; call the worker's "
            "init_process_group() first"
        )
    return fsdp_wrap(module, init_device_mesh(device_type, (world_size,)), reshard_after_forward,
                     offload_policy=offload_policy, forward_prefetch=forward_prefetch, param_dtype=param_dtype)


def fsdp_wrap(module: nn.Module, mesh, reshard_after_forward: bool, *, offload_policy: bool = False,
              forward_prefetch: bool = False, param_dtype: torch.dtype | None = None) -> nn.Module:
    """``fully_shard`` every transformer block of ``module`` and then the root over ``mesh`` (see
    :func:`shard_module` for the options)."""
    layer_names = _layer_class_names(module)
    if not layer_names:
        raise ValueError(f"{type(module).__name__} declares no transformer block class (_no_split_modules)")
    device_type = mesh.device_type
    options = {"mesh": mesh, "reshard_after_forward": reshard_after_forward,
               "offload_policy": CPUOffloadPolicy(pin_memory=device_type == "cuda") if offload_policy
               else OffloadPolicy(),
               "mp_policy": MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
               if param_dtype is not None else MixedPrecisionPolicy()}
    layers = [sub for sub in list(module.modules()) if type(sub).__name__ in layer_names]
    for layer in layers:
        fully_shard(layer, **options)
    fully_shard(module, **options)
    if forward_prefetch:
        for layer, following in zip(layers, layers[1:]):
            layer.set_modules_to_forward_prefetch([following])
    return module


def compute_dtype(fsdp_config: RefFSDPConfig | RefMegatronConfig, module: nn.Module) -> torch.dtype | None:
    """The mixed-precision dtype of a role (``fsdp_config.dtype``) when it differs from the dtype
    of the module's parameters (``fsdp_config.model_dtype`` / ``model.dtype``), else None."""
    from rlvr.workers.models import torch_dtype

    if fsdp_config.dtype is None:
        return None
    dtype = torch_dtype(fsdp_config.dtype)
    return None if dtype == next(module.parameters()).dtype else dtype


def fsdp_options(fsdp_config, module: nn.Module) -> dict:
    """The :func:`shard_module` options of a role's ``fsdp_config`` (reshard, CPU offload policy,
    forward prefetch, mixed precision)."""
    return {"reshard_after_forward": fsdp_config.reshard_after_forward, "offload_policy": fsdp_config.offload_policy,
            "forward_prefetch": fsdp_config.forward_prefetch, "param_dtype": compute_dtype(fsdp_config, module)}


def shard_role_module(module: nn.Module, world_size: int, device_type: str, fsdp_config) -> nn.Module:
    """:func:`shard_module` with a role's ``fsdp_config`` (:func:`fsdp_options`)."""
    options = fsdp_options(fsdp_config, module)
    return shard_module(module, world_size, device_type, options.pop("reshard_after_forward"), **options)


def clip_grad_norm(module: nn.Module, max_norm: float) -> float:
    """Clip the global gradient norm (over all shards) to ``max_norm``; returns the norm before
    clipping (``inf``/``nan`` when a gradient is not finite; nothing is clipped then)."""
    params = [p for p in module.parameters() if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm, error_if_nonfinite=False, foreach=True)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    return float(norm)


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
