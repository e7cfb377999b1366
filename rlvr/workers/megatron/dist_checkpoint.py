"""Weights from a Megatron distributed checkpoint (verl's ``megatron.use_dist_checkpointing``).

verl can start a Megatron role from a ``megatron.core.dist_checkpointing`` folder
(``dist_checkpointing_path``: the format its HF -> mcore converter writes) instead of the Hugging
Face weights. rlvr reads such a folder into full tensors with torch's distributed-checkpoint reader
(no process group, no megatron import), turns them into Hugging Face tensors with the same
:mod:`~rlvr.workers.megatron.hf_mapping` rules its own loader uses, and loads them into the HF model
before it is cut into this run's tensor/pipeline shards. The checkpoint's layout does not have to
match the run's: its tensors are global.

What the folder holds (checked on megatron-core 0.16.1): one global tensor per parameter. Decoder
layers are stacked under ``decoder.layers.<name>`` (a leading axis of the layers; a per-layer
``decoder.layers.<i>.<name>`` is read too), RMSNorm weights carry transformer-engine's names
(``linear_qkv.layer_norm_weight``, ``linear_fc1.layer_norm_weight``) whichever layer spec wrote
them, the fused QKV rows are the query groups in order and the SwiGLU ``linear_fc1`` is all gate
rows then all up rows, i.e. each tensor is what one tensor-parallel rank would hold. The vocabulary
may be padded; the padding rows are dropped.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from rlvr.workers.megatron.hf_mapping import LlamaShape, stage_rules

__all__ = ["read_dist_checkpoint", "hf_state_from_megatron", "load_dist_checkpoint"]

TE_NAMES = {"self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
            "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight"}
"""transformer-engine's names of the layer norms -> megatron-core's local layer spec (rlvr's)."""


def read_dist_checkpoint(path: str | Path, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor of the distributed checkpoint at ``path`` as one full (global) tensor, keyed by
    its checkpoint name less ``prefix`` (verl's ``dist_checkpointing_prefix``); objects (megatron's
    ``_extra_state``) are skipped.

    Raises:
        FileNotFoundError: ``path`` holds no distributed checkpoint (no ``.metadata``).
    """
    from torch.distributed.checkpoint import FileSystemReader, load
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    folder = Path(path)
    if not (folder / ".metadata").is_file():
        raise FileNotFoundError(f"{folder} is not a Megatron distributed checkpoint (it has no .metadata file)")
    reader = FileSystemReader(str(folder))
    metadata = reader.read_metadata()
    state = {key: torch.empty(meta.size, dtype=meta.properties.dtype)
             for key, meta in metadata.state_dict_metadata.items()
             if isinstance(meta, TensorStorageMetadata) and key.startswith(prefix)}
    with warnings.catch_warnings():  # "no process group: assuming a single process", which is the intent
        warnings.simplefilter("ignore", UserWarning)
        load(state, storage_reader=reader, no_dist=True)
    return {key[len(prefix):]: tensor for key, tensor in state.items()}


def _per_layer(tensors: Mapping[str, torch.Tensor], num_layers: int) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors under rlvr's per-layer megatron names."""
    out: dict[str, torch.Tensor] = {}
    for key, tensor in tensors.items():
        if not key.startswith("decoder.layers."):
            out[key] = tensor
            continue
        rest = key[len("decoder.layers."):]
        index, _, name = rest.partition(".")
        if index.isdigit():
            out[f"decoder.layers.{index}.{TE_NAMES.get(name, name)}"] = tensor
            continue
        if tensor.shape[0] != num_layers:
            raise ValueError(f"the checkpoint's {key} stacks {tensor.shape[0]} layers; the model has {num_layers}")
        for layer in range(num_layers):
            out[f"decoder.layers.{layer}.{TE_NAMES.get(rest, rest)}"] = tensor[layer]
    return out


def hf_state_from_megatron(tensors: Mapping[str, torch.Tensor], hf_config, prefix: str = "model.",
                           lm_head: bool = True) -> dict[str, torch.Tensor]:
    """Hugging Face tensors (names with ``prefix``) from a distributed checkpoint's global tensors.

    Args:
        tensors: :func:`read_dist_checkpoint`'s result.
        hf_config: the HF config of the model (layers, heads, vocabulary, tied head).
        lm_head: the model has an LM head (False for the critic, whose value head stays its own).

    Raises:
        KeyError: the checkpoint lacks a tensor of the model (e.g. a different architecture).
        ValueError: a tensor has a shape the model cannot take.
    """
    megatron = _per_layer(tensors, hf_config.num_hidden_layers)
    embedding = megatron.get("embedding.word_embeddings.weight")
    shape = LlamaShape.from_hf_config(hf_config, 1)
    if embedding is not None:  # the checkpoint's vocabulary padding (a multiple of its tensor-parallel size)
        shape = replace(shape, padded_vocab=embedding.shape[0])
    rules = stage_rules(shape, 1, 0, prefix, lm_head)
    missing = sorted(set(rules) - set(megatron))
    if missing:
        raise KeyError(f"the distributed checkpoint has no {missing[:4]}{' ...' if len(missing) > 4 else ''} "
                       f"(is it a checkpoint of this model?)")
    hf: dict[str, torch.Tensor] = {}
    for name, rule in rules.items():
        hf.update(zip(rule.hf_names, rule.unshard([megatron[name]])))
    return hf


def load_dist_checkpoint(module: nn.Module, path: str | Path, hf_config, ckpt_prefix: str = "",
                         prefix: str = "model.", lm_head: bool = True) -> None:
    """Load the distributed checkpoint at ``path`` into the HF module ``module`` (in place; cast to
    its dtype). Every tensor the mapping gives must be a parameter of ``module``; parameters it does
    not give (the critic's value head) keep their values.

    Raises:
        KeyError: a tensor of the checkpoint has no place in ``module``.
        ValueError: a tensor's shape differs from the module's.
    """
    state = hf_state_from_megatron(read_dist_checkpoint(path, ckpt_prefix), hf_config, prefix, lm_head)
    own = module.state_dict()
    unknown = sorted(set(state) - set(own))
    if unknown:
        raise KeyError(f"the module has no {unknown[:4]}")
    for name, tensor in state.items():
        if own[name].shape != tensor.shape:
            raise ValueError(f"{name}: the distributed checkpoint gives shape {tuple(tensor.shape)}, "
                             f"the model has {tuple(own[name].shape)}")
    module.load_state_dict(state, strict=False)
