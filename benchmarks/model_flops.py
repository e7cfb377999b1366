"""Model FLOPs of one GRPO optimizer step, and the update's model FLOPs utilisation (MFU).

A decoder of ``L`` layers, width ``h``, attention width ``a`` (query heads x head dim) trains on a
sequence of ``n`` real tokens at ``6 N`` FLOPs per token for its parameter matmuls (2 forward, 4
backward; Kaplan et al. 2020, "Scaling Laws for Neural Language Models", sec. 2.1) plus the
attention scores and their weighted sum, ``12 L a n`` per token (PaLM's count, Chowdhery et al.
2022, appendix B: ``QK^T`` and ``AV``, 2 ``a n`` FLOPs each forward, x3 with the backward, the full
context counted, as PaLM does, not halved for the causal mask). Over a batch of sequences::

    flops = 6 * N_body * sum(n_s) + 6 * N_head * response_tokens + 12 * L * a * sum(n_s ** 2)

``N_body`` is the decoder's parameters without the embedding (layers and final norm: every token,
prompt and response, passes them); ``N_head = vocab x h`` is the LM head's matmul, counted once
even with tied embeddings (the embedding lookup is no matmul), on the response tokens only (both
frameworks run the head there only). Recomputation (checkpointing, rlvr's fused head recomputing
its logits in the backward) is not counted: these are model FLOPs, not hardware FLOPs. Every
sequence counts its own prompt, although rlvr's shared-prompt forward runs each distinct prompt
once per group: its MFU is the work of the plain algorithm over its time.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PretrainedConfig

PEAK_BF16_TFLOPS = (("H100 PCIe", 756.5), ("H100 NVL", 835.5), ("H100", 989.4), ("H200", 989.4),
                    ("H800", 989.4), ("A100", 312.0), ("L40S", 362.05))
"""Dense bf16 tensor-core peaks (NVIDIA data sheets, without sparsity), keyed by a substring of
``torch.cuda.get_device_name()``; the first match wins (the PCIe and NVL H100s before the SXM one)."""


@dataclass(frozen=True)
class FlopShape:
    """What the FLOP count needs of a model: layers, attention width, and the two parameter counts."""

    layers: int
    attention_width: int
    body_params: int
    head_params: int


def decoder_params(cfg: PretrainedConfig) -> tuple[int, int]:
    """``(body, embedding)`` parameter counts of a Llama / Qwen2 decoder, from its config alone.

    Per layer: q (``h x a``), k and v (``h x kv`` each), o (``a x h``), with biases on q/k/v when the
    family has them (Qwen2 always; Llama with ``attention_bias``), the gated MLP ``3 h I`` and two
    RMS norms; plus the final norm. ``embedding = vocab x h`` (the LM head too when untied).
    """
    h, layers = cfg.hidden_size, cfg.num_hidden_layers
    head_dim = getattr(cfg, "head_dim", None) or h // cfg.num_attention_heads
    a, kv = cfg.num_attention_heads * head_dim, cfg.num_key_value_heads * head_dim
    qkv_bias = cfg.model_type == "qwen2" or bool(getattr(cfg, "attention_bias", False))
    attention = h * a + 2 * h * kv + a * h + ((a + 2 * kv) if qkv_bias else 0)
    mlp = 3 * h * cfg.intermediate_size
    body = layers * (attention + mlp + 2 * h) + h
    embedding = cfg.vocab_size * h * (1 if cfg.tie_word_embeddings else 2)
    return body, embedding


def flop_shape(cfg: PretrainedConfig) -> FlopShape:
    """The :class:`FlopShape` of a Llama / Qwen2 config."""
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    body, _ = decoder_params(cfg)
    return FlopShape(layers=cfg.num_hidden_layers, attention_width=cfg.num_attention_heads * head_dim,
                     body_params=body, head_params=cfg.vocab_size * cfg.hidden_size)


def step_flops(shape: FlopShape, sequence_lengths: list[int], response_tokens: int) -> float:
    """Model FLOPs of one optimizer step over sequences of ``sequence_lengths`` real tokens (prompt
    plus response), ``response_tokens`` of them in responses (see the module docstring)."""
    tokens = sum(sequence_lengths)
    squares = sum(n * n for n in sequence_lengths)
    return float(6 * shape.body_params * tokens + 6 * shape.head_params * response_tokens
                 + 12 * shape.layers * shape.attention_width * squares)


def peak_tflops(device: torch.device, override: float | None = None) -> float | None:
    """The device's dense bf16 peak in TFLOPS: ``override`` when given, else the table's entry for a
    CUDA device's name; None on CPU or for a GPU not in :data:`PEAK_BF16_TFLOPS`."""
    if override is not None:
        return override
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_BF16_TFLOPS if key in name), None)


def utilisation(flops: float, seconds: float, peak: float | None) -> dict[str, float | None]:
    """``{"tflops": achieved TFLOPS, "mfu": tflops / peak (None without a peak)}``."""
    tflops = flops / seconds / 1e12
    return {"tflops": tflops, "mfu": tflops / peak if peak else None}
