"""Checkpoints of a Megatron worker: one file per model-parallel rank, and the Hugging Face export.

A checkpoint folder holds ``megatron_tp<t>_pp<p>.pt`` for every tensor-parallel rank ``t`` and
pipeline stage ``p``: that rank's parameters, optimizer state and LR-scheduler state, written by
data-parallel rank 0 (the other data-parallel ranks hold the same) under a temporary name and
renamed. With expert parallelism the ranks of one stage hold different experts: the files are
``megatron_tp<t>_pp<p>_ep<e>_etp<x>.pt``, one per expert coordinate, written by the first rank that
holds those experts (expert-data-parallel rank 0). Nothing is gathered, so a checkpoint costs each rank its own shard, and it loads into the
same tensor x pipeline layout (any data-parallel size); another layout is refused with the sizes
it was written with. ``export_hf`` gathers the full weights to write a Hugging Face folder, which
starts a run of any strategy and layout. A LoRA actor's shards hold its frozen weights and its
adapters (``...adapter.A_<part>`` / ``B_<part>``) with ``lora_scale``; its export (and
``rlvr.model_merger``) gives the merged weights.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from transformers import PreTrainedTokenizerBase

from rlvr.workers.checkpoint import atomic_save, save_hf_folder
from rlvr.workers.megatron.parallel import MegatronParallel
from rlvr.workers.megatron.weights import gather_hf_weights

__all__ = ["save_megatron_state", "load_megatron_state", "export_megatron_hf"]


def _experts_split(module: nn.Module, parallel: MegatronParallel) -> bool:
    """Whether the ranks of a stage hold different experts (an MoE model over expert ranks)."""
    return module.shape.num_experts > 0 and parallel.ep * parallel.etp > 1


def _file(folder: Path, module: nn.Module, parallel: MegatronParallel) -> Path:
    experts = f"_ep{parallel.ep_rank}_etp{parallel.etp_rank}" if _experts_split(module, parallel) else ""
    return folder / f"megatron_tp{parallel.tp_rank}_pp{parallel.pp_rank}{experts}.pt"


def _layout(module: nn.Module, parallel: MegatronParallel) -> dict[str, int]:
    """The sizes a shard depends on (the expert sizes only for an MoE model)."""
    sizes = {"tensor_model_parallel_size": parallel.tp, "pipeline_model_parallel_size": parallel.pp}
    if module.shape.num_experts:
        sizes.update(expert_model_parallel_size=parallel.ep, expert_tensor_parallel_size=parallel.etp)
    return sizes


def _lora_scale(module: nn.Module) -> float | None:
    """``alpha / r`` of the module's LoRA adapters (what ``rlvr.model_merger`` merges with); None without."""
    adapters = getattr(module, "lora_adapters", {})
    return next(iter(adapters.values())).spec.scale if adapters else None


def save_megatron_state(path: str | os.PathLike, module: nn.Module, optimizer: torch.optim.Optimizer | None,
                        scheduler: Any, parallel: MegatronParallel) -> None:
    """Write this rank's shard of the model, optimizer and scheduler states into the folder ``path``
    (collective: every rank of the model calls it)."""
    # one copy of each shard: data-parallel rank 0 (expert-data-parallel rank 0 where the experts are
    # split), context-parallel rank 0 (context-parallel peers hold the same shard)
    if (parallel.edp_rank if _experts_split(module, parallel) else parallel.dp_rank) == 0 and parallel.cp_rank == 0:
        atomic_save({
            "layout": _layout(module, parallel),
            "model": {name: param.detach().cpu() for name, param in module.named_parameters()},
            "optimizer": optimizer.state_dict() if optimizer is not None else None,
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "lora_scale": _lora_scale(module),
        }, _file(Path(path), module, parallel))
    dist.barrier()


def _layout_error(folder: Path, module: nn.Module, parallel: MegatronParallel) -> str:
    found = sorted(p.name for p in folder.glob("megatron_tp*_pp*.pt"))
    if not found:
        written = "by the fsdp2 strategy" if (folder / "model.pt").is_file() else "by no Megatron worker"
        return (f"the checkpoint {folder} was written {written}; resume it with the strategy that wrote it, or "
                "export it to Hugging Face (export_hf) and start from that folder")
    sizes = torch.load(folder / found[0], map_location="cpu", weights_only=False)["layout"]
    this_run = ", ".join(f"{key}={value}" for key, value in _layout(module, parallel).items())
    return (f"the checkpoint {folder} was written with {sizes}; this run has {this_run}: resume with the same sizes, "
            "or start from an export_hf folder")


def load_megatron_state(path: str | os.PathLike, module: nn.Module, optimizer: torch.optim.Optimizer | None,
                        scheduler: Any, parallel: MegatronParallel) -> None:
    """Restore what :func:`save_megatron_state` wrote, on every rank (same layout).

    Raises:
        FileNotFoundError: the folder holds no shard for this rank (another layout or strategy).
    """
    folder = Path(path)
    file = _file(folder, module, parallel)
    if not file.is_file():
        raise FileNotFoundError(_layout_error(folder, module, parallel))
    state = torch.load(file, map_location="cpu", weights_only=False)
    if state["layout"] != _layout(module, parallel):
        raise FileNotFoundError(_layout_error(folder, module, parallel))
    params = dict(module.named_parameters())
    if params.keys() != state["model"].keys():
        raise KeyError(f"the checkpoint shard {file} holds other parameters than the model: "
                       f"{sorted(params.keys() ^ state['model'].keys())[:4]}")
    with torch.no_grad():
        for name, tensor in state["model"].items():
            params[name].copy_(tensor)
    if optimizer is not None:
        optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None:
        scheduler.load_state_dict(state["scheduler"])
    dist.barrier()


def export_megatron_hf(path: str | os.PathLike, module: nn.Module, tokenizer: PreTrainedTokenizerBase | None,
                       rank: int) -> None:
    """Gather the policy's full weights (collective) and write them, on global rank 0, as a Hugging
    Face folder at ``path``."""
    state = dict(gather_hf_weights(module))
    if rank == 0:
        if module.shape.tied:
            state["lm_head.weight"] = state["model.embed_tokens.weight"]
        save_hf_folder(path, module.hf_config, module.hf_generation_config, state, tokenizer)
    dist.barrier()
