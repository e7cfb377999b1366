"""Small mixture-of-experts models made on this machine: Qwen3-MoE, Qwen2-MoE (shared expert),
Mixtral and OLMoE, as transformers implements them, with random weights from a config.

No MoE checkpoint can be downloaded here, so tests (and the small MoE job) build the real
architectures from a config, as TRL's and verl's tests do: 8 experts, 2 per token, every layer
sparse; Qwen2-MoE adds its sigmoid-gated shared expert. The default sizes are tiny (hidden 32, 2
layers, the byte-level tokenizer of :func:`rlvr.utils.testing.tiny_tokenizer`); the job passes a
vocabulary and sizes of its own.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from transformers import (
    MixtralConfig,
    MixtralForCausalLM,
    OlmoeConfig,
    OlmoeForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from rlvr.utils.testing import tiny_tokenizer

__all__ = ["TINY_MOE_ARCHS", "tiny_moe_config", "tiny_moe_lm", "save_tiny_moe"]

TINY_MOE_ARCHS = ("qwen3_moe", "qwen2_moe", "mixtral", "olmoe")


def tiny_moe_config(arch: str, vocab_size: int = 260, hidden_size: int = 32, num_hidden_layers: int = 2,
                    num_experts: int = 8, top_k: int = 2, expert_size: int = 16, num_attention_heads: int = 4,
                    num_key_value_heads: int = 2, **overrides) -> PretrainedConfig:
    """The config of a small ``arch`` MoE (:data:`TINY_MOE_ARCHS`): ``num_attention_heads`` heads of
    ``hidden_size / num_attention_heads``, ``num_experts`` experts of width ``expert_size``, ``top_k``
    per token, tied embeddings; ``overrides`` are further config fields (e.g. ``output_router_logits=True``)."""
    common = dict(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_hidden_layers,
                  num_attention_heads=num_attention_heads, num_key_value_heads=num_key_value_heads,
                  max_position_embeddings=2048,
                  tie_word_embeddings=True, num_experts_per_tok=top_k, pad_token_id=0, bos_token_id=1,
                  eos_token_id=3)
    if arch == "qwen3_moe":
        config = Qwen3MoeConfig(**common, num_experts=num_experts, moe_intermediate_size=expert_size,
                                intermediate_size=4 * expert_size, head_dim=hidden_size // num_attention_heads,
                                norm_topk_prob=True)
    elif arch == "qwen2_moe":
        config = Qwen2MoeConfig(**common, num_experts=num_experts, moe_intermediate_size=expert_size,
                                intermediate_size=4 * expert_size, shared_expert_intermediate_size=2 * expert_size)
    elif arch == "mixtral":
        config = MixtralConfig(**common, num_local_experts=num_experts, intermediate_size=expert_size)
    elif arch == "olmoe":
        config = OlmoeConfig(**common, num_experts=num_experts, intermediate_size=expert_size)
    else:
        raise ValueError(f"unknown tiny MoE architecture {arch!r}; use one of {TINY_MOE_ARCHS}")
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


_CLASSES = {"qwen3_moe": Qwen3MoeForCausalLM, "qwen2_moe": Qwen2MoeForCausalLM, "mixtral": MixtralForCausalLM,
            "olmoe": OlmoeForCausalLM}


def tiny_moe_lm(arch: str, seed: int = 0, dtype: torch.dtype = torch.float32, **config_kwargs) -> PreTrainedModel:
    """A random ``arch`` MoE causal LM from :func:`tiny_moe_config` (``config_kwargs`` passed on),
    in eval mode; its weights depend only on ``seed`` (the global RNG is left untouched)."""
    config = tiny_moe_config(arch, **config_kwargs)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = _CLASSES[arch](config).to(dtype)
    model.config.architectures = [type(model).__name__]  # as save_pretrained writes it (vLLM reads it)
    return model.eval()


def save_tiny_moe(path: str | os.PathLike, arch: str, tokenizer: PreTrainedTokenizerBase | None = None,
                  seed: int = 0, **config_kwargs) -> Path:
    """Write :func:`tiny_moe_lm` and a tokenizer (default: :func:`~rlvr.utils.testing.tiny_tokenizer`)
    to the folder ``path``, loadable with :func:`rlvr.utils.model.load_causal_lm`; the model's
    vocabulary is the tokenizer's length unless ``vocab_size`` is given."""
    tokenizer = tiny_tokenizer() if tokenizer is None else tokenizer
    config_kwargs.setdefault("vocab_size", len(tokenizer))
    model = tiny_moe_lm(arch, seed=seed, **config_kwargs)
    model.config.pad_token_id = tokenizer.pad_token_id
    model.config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    path = Path(path)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
