"""Attention over packed sequences for transformers models (``model.use_remove_padding``).

:func:`use_packed_attention` switches a model to the implementation ``"rlvr_packed_<base>"``
(``<base>`` = the model's own: ``sdpa``, ``eager``, ``flash_attention_2``, ...), registered with
transformers' ``AttentionInterface`` and ``AttentionMaskInterface``. A call that carries the
packed-sequence boundaries (``cu_seq_lens_q``, built by :class:`rlvr.workers.packing.PackedBatch`)
attends within each sequence only; any other call (the rollout's padded batches, generation with
a KV cache) goes to ``<base>`` unchanged, with ``<base>``'s masks.

Inside a packed call:

- under Ulysses sequence parallelism the query, key and value go from "all heads, my tokens" to
  "my heads, all tokens" and the output back (:mod:`rlvr.workers.ulysses`);
- the attention itself runs on the sequence boundaries with the fastest exact kernel there is:
  transformers' flash-attention varlen path when the model runs flash attention
  (``attn_implementation=flash_attention_2``); on CUDA in bf16/fp16 otherwise, PyTorch's own
  flash-attention varlen kernel (``torch.nn.attention.varlen.varlen_attn``); else (CPU, float32)
  PyTorch's ``scaled_dot_product_attention`` once per sequence, causal. On 2 CPU cores that is
  2.6x faster than one SDPA call over the packed row with a block-diagonal mask (what
  transformers' SDPA path builds for packed position ids: ``T x T`` memory), and flex attention
  has no backward on CPU in torch 2.13 (see docs/PERFORMANCE.md).

The mask that transformers would build for a packed call is skipped (the boundaries replace it)
while :func:`packed_forward` is active; the attention call itself reads only its arguments, so
activation checkpointing's recompute (outside that context) attends the same way.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
from collections.abc import Iterator
from contextvars import ContextVar

import torch
from torch import nn
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from rlvr.workers.packing import SEQUENCE_PARALLEL_KWARG
from rlvr.workers.ulysses import SequenceParallel, heads_to_sequence, sequence_to_heads

__all__ = ["PACKED_PREFIX", "use_packed_attention", "packed_forward", "segment_sdpa"]

PACKED_PREFIX = "rlvr_packed_"
_SKIP_MASK: ContextVar[bool] = ContextVar("rlvr_packed_forward", default=False)


@contextlib.contextmanager
def packed_forward() -> Iterator[None]:
    """While active, models on a packed implementation build no attention mask (a packed call)."""
    token = _SKIP_MASK.set(True)
    try:
        yield
    finally:
        _SKIP_MASK.reset(token)


def _base_attention(module: nn.Module, base: str):
    """The attention function of ``base`` for ``module`` (an attention layer of a transformers model)."""
    if base == "eager":  # not in the registry: each model's modelling file defines its own
        return sys.modules[type(module).__module__].eager_attention_forward
    return ALL_ATTENTION_FUNCTIONS[base]


def segment_sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seqlens: torch.Tensor,
                 scaling: float | None, dropout: float = 0.0, sliding_window: int | None = None) -> torch.Tensor:
    """Causal attention within each packed sequence: one SDPA call per sequence.

    Args:
        query: ``[1, H, T, d]``; key, value: ``[1, Hkv, T, d]`` (``H % Hkv == 0``).
        cu_seqlens: ``[n + 1]`` sequence boundaries in ``0..T``.
        sliding_window: attend to at most this many most recent keys (transformers' convention).

    Returns:
        ``[1, T, H, d]``.
    """
    gqa = query.shape[1] != key.shape[1]
    outputs = []
    bounds = cu_seqlens.tolist()
    for start, stop in zip(bounds[:-1], bounds[1:]):
        q, k, v = query[:, :, start:stop], key[:, :, start:stop], value[:, :, start:stop]
        mask = None
        if sliding_window is not None and stop - start > sliding_window:
            idx = torch.arange(stop - start, device=query.device)
            mask = (idx[:, None] >= idx[None, :]) & (idx[:, None] - idx[None, :] < sliding_window)
        outputs.append(torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=mask is None, scale=scaling, enable_gqa=gqa))
    return torch.cat(outputs, dim=2).transpose(1, 2)


def _varlen(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, base: str,
            dropout: float, scaling: float | None, sliding_window: int | None, kwargs: dict) -> torch.Tensor:
    """Attention within the packed sequences: ``[1, H, T, d]`` (key/value ``[1, Hkv, T, d]``) -> ``[1, T, H, d]``."""
    cu_seqlens, max_len = kwargs["cu_seq_lens_q"], int(kwargs["max_length_q"])
    if base.startswith("flash_attention"):  # transformers' packed-sequence (varlen) path
        out, _ = _base_attention(module, base)(module, query, key, value, None, dropout=dropout, scaling=scaling,
                                       sliding_window=sliding_window, **kwargs)
        return out
    if query.is_cuda and query.dtype in (torch.float16, torch.bfloat16) and dropout == 0.0:
        from torch.nn.attention.varlen import varlen_attn

        return varlen_kernel_attention(varlen_attn, query, key, value, cu_seqlens, max_len, scaling, sliding_window)
    return segment_sdpa(query, key, value, cu_seqlens, scaling, dropout, sliding_window)


@functools.cache
def _takes_enable_gqa(kernel) -> bool:
    """Whether ``kernel`` (``varlen_attn``) has the ``enable_gqa`` argument (torch 2.13 has it,
    torch 2.11 does not)."""
    return "enable_gqa" in inspect.signature(kernel).parameters


def varlen_kernel_attention(kernel, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            cu_seqlens: torch.Tensor, max_len: int, scaling: float | None,
                            sliding_window: int | None) -> torch.Tensor:
    """Causal attention within packed sequences through PyTorch's varlen kernel.

    Args:
        kernel: ``torch.nn.attention.varlen.varlen_attn`` (or a function with its signature).
        query: ``[1, H, T, d]``; key/value ``[1, Hkv, T, d]`` with ``H % Hkv == 0``.
        cu_seqlens: ``[n + 1]`` int32 sequence boundaries; ``max_len`` the longest sequence.

    Returns:
        ``[1, T, H, d]``. Where the kernel has no ``enable_gqa`` (torch 2.11), grouped key/value
        heads are repeated to ``H`` first: the same result, ``H / Hkv`` times the key/value memory.
    """
    window = (-1, 0) if sliding_window is None else (sliding_window - 1, 0)
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [T, heads, d]
    grouped = q.shape[1] != k.shape[1]
    extra = {}
    if grouped and _takes_enable_gqa(kernel):
        extra["enable_gqa"] = True
    elif grouped:
        if q.shape[1] % k.shape[1]:
            raise ValueError(f"packed attention: {q.shape[1]} query heads are not a multiple of "
                             f"{k.shape[1]} key/value heads")
        repeat = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
    out = kernel(q, k, v, cu_seqlens, cu_seqlens, max_len, max_len, scale=scaling, window_size=window, **extra)
    return out[None]


def _packed_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      *, base: str, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention interface: ``query [b, H, s, d]``, ``key``/``value [b, Hkv, s, d]`` ->
    ``([b, s, H, d], None)``; packed when ``cu_seq_lens_q`` is given, else ``base``'s attention."""
    if kwargs.get("cu_seq_lens_q") is None:
        kwargs.pop(SEQUENCE_PARALLEL_KWARG, None)
        attention = _base_attention(module, base)
        return attention(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    for unsupported in ("softcap", "s_aux", "position_bias"):
        if kwargs.get(unsupported) is not None:
            raise ValueError(f"packed sequences (use_remove_padding) do not support attention with {unsupported}; "
                             "set use_remove_padding=False for this model")
    sp: SequenceParallel | None = kwargs.pop(SEQUENCE_PARALLEL_KWARG, None)
    sliding_window = kwargs.pop("sliding_window", None)
    if sp is not None:
        query, key, value = (heads_to_sequence(x, sp) for x in (query, key, value))
    out = _varlen(module, query, key, value, base, dropout, scaling, sliding_window, kwargs)
    if sp is not None:
        out = sequence_to_heads(out, sp)
    return out, None


def _packed_mask(*args, base: str, **kwargs):
    """No mask for a packed call (:func:`packed_forward`); ``base``'s mask otherwise."""
    if _SKIP_MASK.get():
        return None
    return ALL_MASK_ATTENTION_FUNCTIONS[base](*args, **kwargs)


def use_packed_attention(model: nn.Module) -> None:
    """Switch a transformers model (the ``PreTrainedModel``, not a wrapper) to the packed attention
    over its current implementation (idempotent)."""
    base = model.config._attn_implementation
    if base.startswith(PACKED_PREFIX):
        return
    name = PACKED_PREFIX + base
    if name not in ALL_ATTENTION_FUNCTIONS.valid_keys():
        AttentionInterface.register(name, functools.partial(_packed_attention, base=base))
        mask_base = base if base in ALL_MASK_ATTENTION_FUNCTIONS else "sdpa"
        AttentionMaskInterface.register(name, functools.partial(_packed_mask, base=mask_base))
    model.set_attn_implementation(name)
