"""Worker checkpoints: model, optimizer and LR scheduler, and the Hugging Face export.

States are gathered unsharded on rank 0 (``torch.distributed.checkpoint.state_dict`` with
``full_state_dict=True``), so a checkpoint loads into any number of ranks. Rank 0 writes each file
under a temporary name and renames it (atomic on POSIX); the other ranks wait at a barrier.
Layout of a checkpoint folder: ``model.pt``, ``optim.pt``, ``scheduler.pt``.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from peft import PeftModel
from torch import nn
from transformers import GenerationConfig, PretrainedConfig, PreTrainedTokenizerBase, ProcessorMixin

from rlvr.utils.files import replaced_atomically
from rlvr.utils.model import auto_model_class
from rlvr.utils.processor import save_processor
from rlvr.workers.fsdp import (
    full_optimizer_state_dict,
    full_state_dict,
    load_full_optimizer_state_dict,
    load_full_state_dict,
)
from rlvr.workers.models import unwrap_hf_model

__all__ = ["atomic_save", "save_training_state", "load_training_state", "export_hf_model", "merge_lora",
           "save_hf_folder"]


def _barrier(world_size: int) -> None:
    if world_size > 1:
        dist.barrier()


_LOW_SPACE_BYTES = 64 * 2**20  # a failed write with less than this free on its disk is reported as a full disk


def atomic_save(obj: Any, path: Path) -> None:
    """``torch.save`` to a temporary file next to ``path``, then rename it to ``path``.

    A failed write leaves ``path`` as it was and removes the partial file. When the disk is full
    (``ENOSPC``, or under 64 MiB free after the failure: torch's zip writer then reports only
    "unexpected pos"), raises ``OSError(ENOSPC)`` naming the file, the MiB written and the MiB free.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with replaced_atomically(path) as tmp:
        try:
            torch.save(obj, tmp)
        except (OSError, RuntimeError) as error:
            written = os.path.getsize(tmp) if os.path.exists(tmp) else 0
            free = shutil.disk_usage(path.parent).free
            if free < _LOW_SPACE_BYTES or getattr(error, "errno", None) == errno.ENOSPC:
                raise OSError(errno.ENOSPC, f"writing {path} failed after {written / 2**20:.0f} MiB with "
                              f"{free / 2**20:.0f} MiB free on its disk ({error}); the files already there are "
                              "untouched: free space or set trainer.default_local_dir to a larger disk, then "
                              "resume") from error
            raise


def save_training_state(path: str | os.PathLike, module: nn.Module, optimizer: torch.optim.Optimizer | None,
                        scheduler: Any, rank: int, world_size: int) -> None:
    """Write the module, optimizer and scheduler states to the folder ``path`` (collective)."""
    folder = Path(path)
    model_state = full_state_dict(module, world_size)
    optim_state = full_optimizer_state_dict(module, optimizer, world_size) if optimizer is not None else None
    if rank == 0:
        atomic_save(model_state, folder / "model.pt")
        if optim_state is not None:
            atomic_save(optim_state, folder / "optim.pt")
        if scheduler is not None:
            atomic_save(scheduler.state_dict(), folder / "scheduler.pt")
    _barrier(world_size)


def _read(path: Path, rank: int) -> Any:
    if rank != 0:
        return {}
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint file {path} is missing; was the checkpoint written completely?")
    return torch.load(path, map_location="cpu", weights_only=False)


def load_training_state(path: str | os.PathLike, module: nn.Module, optimizer: torch.optim.Optimizer | None,
                        scheduler: Any, rank: int, world_size: int) -> None:
    """Restore what :func:`save_training_state` wrote (collective; rank 0 reads the files)."""
    folder = Path(path)
    load_full_state_dict(module, _read(folder / "model.pt", rank), world_size)
    if optimizer is not None:
        load_full_optimizer_state_dict(module, optimizer, _read(folder / "optim.pt", rank), world_size)
    if scheduler is not None:
        scheduler_file = folder / "scheduler.pt"
        if not scheduler_file.is_file():
            raise FileNotFoundError(f"checkpoint file {scheduler_file} is missing")
        scheduler.load_state_dict(torch.load(scheduler_file, map_location="cpu", weights_only=False))
    _barrier(world_size)


def merge_lora(state: dict[str, torch.Tensor], module: PeftModel) -> dict[str, torch.Tensor]:
    """Fold the LoRA adapters of a peft state dict into the base weights.

    ``W' = W + scale * B @ A`` with ``scale = lora_alpha / r`` (``/ sqrt(r)`` with rsLoRA); the
    keys lose peft's prefixes, so the result loads into the plain base model.

    Args:
        state: full state dict of the ``PeftModel`` (``base_model.model.<name>.base_layer.weight``,
            ``...lora_A.default.weight`` ``[r, in]``, ``...lora_B.default.weight`` ``[out, r]``).
        module: the peft model (for the adapter config).
    """
    config = module.peft_config[module.active_adapter]
    scale = config.lora_alpha / (config.r**0.5 if config.use_rslora else config.r)
    adapter = module.active_adapter
    merged: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if ".lora_" in key:
            continue
        name = key.removeprefix("base_model.model.")
        if ".base_layer." in name:
            prefix = key.split(".base_layer.")[0]
            name = name.replace(".base_layer.", ".")
            if key.endswith(".weight"):
                lora_a = state[f"{prefix}.lora_A.{adapter}.weight"].float()
                lora_b = state[f"{prefix}.lora_B.{adapter}.weight"].float()
                value = (value.float() + scale * (lora_b @ lora_a)).to(value.dtype)
        merged[name] = value
    return merged


def export_hf_model(path: str | os.PathLike, module: nn.Module, tokenizer: PreTrainedTokenizerBase | None,
                    rank: int, world_size: int, processor: ProcessorMixin | None = None,
                    auto_cls: type | None = None) -> None:
    """Write the policy as a Hugging Face folder (``from_pretrained`` loads it); LoRA merged.

    Rank 0 builds the plain model from the gathered weights, saves it with its tokenizer (a
    vision-language model: its processor, tokenizer included) into a temporary folder and renames it
    to ``path`` (an existing folder there is replaced). ``auto_cls`` builds the saved model (None:
    the causal LM's or vision-language model's auto class; a reward model passes
    ``AutoModelForSequenceClassification``).
    """
    state = full_state_dict(module, world_size)
    if rank == 0:
        hf_model = unwrap_hf_model(module)
        if isinstance(module, PeftModel):
            state = merge_lora(state, module)
        generation_config = hf_model.generation_config if hf_model.can_generate() else None  # a classifier has none
        save_hf_folder(path, hf_model.config, generation_config, state, tokenizer, processor, auto_cls)
    _barrier(world_size)


def save_hf_folder(path: str | os.PathLike, config: PretrainedConfig, generation_config: GenerationConfig | None,
                   state: dict[str, torch.Tensor], tokenizer: PreTrainedTokenizerBase | None,
                   processor: ProcessorMixin | None = None, auto_cls: type | None = None) -> None:
    """Write the model of ``config`` (``auto_cls``, else its auto class: a causal LM, or a vision-language model) with
    the full weights ``state`` (HF names, every key of the model's state dict) and the processor, else
    the tokenizer, as a Hugging Face folder: into a temporary folder, renamed to ``path`` (an existing
    folder there is replaced)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.tmp-"))
    try:
        model_cls = auto_cls or auto_model_class(config.model_type)
        plain = model_cls.from_config(config, dtype=next(iter(state.values())).dtype)
        plain.load_state_dict(state, strict=True)
        if generation_config is not None:
            plain.generation_config = generation_config
        plain.save_pretrained(tmp)
        if processor is not None:
            save_processor(processor, tmp)
        elif tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
