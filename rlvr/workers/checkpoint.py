"""Worker checkpoints: model, optimizer and LR scheduler, and the Hugging Face export.

States are gathered unsharded on rank 0 (``torch.distributed.checkpoint.state_dict`` with
``full_state_dict=True``), so a checkpoint loads into any number of ranks. Rank 0 writes each file
under a temporary name and renames it (atomic on POSIX); the other ranks wait at a barrier.
Layout of a checkpoint folder: ``model.pt``, ``optim.pt``, ``scheduler.pt``, and what turns the
weights back into a Hugging Face folder without the run's config (verl's layout):
``huggingface/`` (the model's config and generation config, its tokenizer or processor) and, for a
model with LoRA adapters, ``lora_train_meta.json`` (rank, alpha, rsLoRA, targets: what
``python -m rlvr.model_merger`` needs to fold or save the adapters).
"""

from __future__ import annotations

import errno
import json
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
           "merge_lora_state", "lora_settings", "save_model_files", "read_model_state", "save_hf_folder",
           "HF_FILES_DIR", "LORA_META_FILE", "MODEL_FILE"]

MODEL_FILE = "model.pt"
"""The full model state dict (HF names; peft's names for a model with LoRA adapters)."""
HF_FILES_DIR = "huggingface"
"""Folder of a checkpoint with the model's config, generation config and tokenizer or processor."""
LORA_META_FILE = "lora_train_meta.json"
"""The LoRA settings of a checkpoint of a model with adapters (verl's file name)."""


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
        atomic_save(model_state, folder / MODEL_FILE)
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
    load_full_state_dict(module, _read(folder / MODEL_FILE, rank), world_size)
    if optimizer is not None:
        load_full_optimizer_state_dict(module, optimizer, _read(folder / "optim.pt", rank), world_size)
    if scheduler is not None:
        scheduler_file = folder / "scheduler.pt"
        if not scheduler_file.is_file():
            raise FileNotFoundError(f"checkpoint file {scheduler_file} is missing")
        scheduler.load_state_dict(torch.load(scheduler_file, map_location="cpu", weights_only=False))
    _barrier(world_size)


def lora_settings(module: PeftModel) -> dict[str, Any]:
    """The settings of the active LoRA adapter of ``module`` that :func:`merge_lora_state` and a peft
    adapter folder need: ``r``, ``lora_alpha``, ``use_rslora``, ``target_modules``, ``task_type``
    (verl's keys of ``lora_train_meta.json``, plus rsLoRA and the targets) and ``adapter_name``."""
    config = module.peft_config[module.active_adapter]
    targets = config.target_modules
    return {"r": int(config.r), "lora_alpha": int(config.lora_alpha), "use_rslora": bool(config.use_rslora),
            "target_modules": targets if isinstance(targets, str) else sorted(targets),
            "task_type": str(config.task_type) if config.task_type is not None else None,
            "adapter_name": module.active_adapter}


def lora_scale(settings: dict[str, Any]) -> float:
    """``lora_alpha / r`` (``/ sqrt(r)`` with rsLoRA) of :func:`lora_settings`."""
    r = settings["r"]
    return settings["lora_alpha"] / (r**0.5 if settings.get("use_rslora", False) else r)


def merge_lora_state(state: dict[str, torch.Tensor], scale: float, adapter: str) -> dict[str, torch.Tensor]:
    """Fold LoRA adapters ``adapter`` of a peft state dict into the base weights:
    ``W' = W + scale * B @ A`` (in float32, cast back to the weight's dtype); the keys lose peft's
    prefixes, so the result loads into the plain base model.

    Args:
        state: full state dict of a ``PeftModel`` (``base_model.model.<name>.base_layer.weight``,
            ``...lora_A.<adapter>.weight`` ``[r, in]``, ``...lora_B.<adapter>.weight`` ``[out, r]``).
        scale: :func:`lora_scale`.
    """
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


def merge_lora(state: dict[str, torch.Tensor], module: PeftModel) -> dict[str, torch.Tensor]:
    """Fold the LoRA adapters of a peft state dict into the base weights (Hu et al. 2021, "LoRA:
    Low-Rank Adaptation of Large Language Models"); see :func:`merge_lora_state`.

    Args:
        state: full state dict of the ``PeftModel``.
        module: the peft model (for the adapter config).
    """
    settings = lora_settings(module)
    return merge_lora_state(state, lora_scale(settings), settings["adapter_name"])


def save_model_files(path: str | os.PathLike, config: PretrainedConfig, generation_config: GenerationConfig | None,
                     tokenizer: PreTrainedTokenizerBase | None, processor: ProcessorMixin | None = None,
                     lora: dict[str, Any] | None = None) -> None:
    """Write what a checkpoint folder needs besides its tensors to become a Hugging Face folder:
    ``huggingface/`` with the model's config, generation config and the processor (else the
    tokenizer), and ``lora_train_meta.json`` when ``lora`` (:func:`lora_settings`) is given. Called
    on rank 0; the checkpoint's folder is written whole or not at all by its caller."""
    folder = Path(path) / HF_FILES_DIR
    folder.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(folder)
    if generation_config is not None:
        generation_config.save_pretrained(folder)
    if processor is not None:
        save_processor(processor, folder)
    elif tokenizer is not None:
        tokenizer.save_pretrained(folder)
    if lora is not None:
        (Path(path) / LORA_META_FILE).write_text(json.dumps(lora, indent=1, sort_keys=True), encoding="utf-8")


def read_model_state(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The full model state dict of the checkpoint folder ``path`` (``model.pt``, on CPU).

    Raises:
        FileNotFoundError: the folder has no ``model.pt``.
        ValueError: the file is not a readable state dict (truncated or corrupted), naming it.
    """
    file = Path(path) / MODEL_FILE
    if not file.is_file():
        raise FileNotFoundError(f"checkpoint file {file} is missing; was the checkpoint written completely?")
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises RuntimeError, UnpicklingError, EOFError... for a damaged file
        raise ValueError(f"checkpoint file {file} cannot be read ({type(err).__name__}: {err}); it is truncated "
                         "or corrupted: take another checkpoint") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"checkpoint file {file} is not a model state dict (name -> tensor)")
    return state


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
                   processor: ProcessorMixin | None = None, model_class: type | None = None) -> None:
    """Write the model of ``config`` (its auto class: a causal LM, or a vision-language model; or
    ``model_class``) with the full weights ``state`` (HF names, every key of the model's state dict)
    and the processor, else the tokenizer, as a Hugging Face folder: into a temporary folder, renamed
    to ``path`` (an existing folder there is replaced)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.tmp-"))
    try:
        cls = model_class or auto_model_class(config.model_type)
        plain = cls.from_config(config, dtype=next(iter(state.values())).dtype)
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
