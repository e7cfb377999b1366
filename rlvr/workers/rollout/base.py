"""The rollout-engine interface and its registry.

An engine turns a batch of left-padded prompts into responses. Engines register under a name
(``actor_rollout_ref.rollout.name``); the default ``"hf"`` engine is a KV-cached decode loop over a
transformers model. A vLLM or SGLang engine implements the same protocol and registers with
``@register_rollout_engine("vllm")``.

Contract of ``generate_sequences(prompts)``:

- input ``prompts``: ``input_ids``, ``attention_mask``, ``position_ids`` ``[B, P]`` (left-padded);
  ``meta_info`` may hold ``eos_token_id``, ``pad_token_id``, ``do_sample``, ``temperature``,
  ``top_p``, ``top_k``, ``n``, ``validate`` (True: use ``rollout.val_kwargs``).
- two optional per-call keys, for agent loops that generate a conversation turn by turn:
  ``meta_info["response_length"]`` (int, ``1 <= L <= rollout.response_length``): at most ``L`` new
  tokens in this call, and the output's response width is ``R = L``;
  ``meta_info["stop"]`` (list of strings, replaces ``rollout.stop`` for this call): a row stops after
  the token that completes a stop string, and that token is kept in the response (mask 1).
  Prompts of different lengths arrive left-padded, as always.
- one response per row unless ``meta_info["n"]`` asks for more: the trainer repeats the prompts
  itself (``batch.repeat(rollout.n, interleave=True)``, as verl does), so ``rollout.n`` in the
  config is not applied by the engine.
- output: ``prompts [B, P]``, ``responses [B, R]`` (right-padded with the pad id, ``R =
  meta_info["response_length"]`` if given, else ``rollout.response_length``), ``input_ids``,
  ``attention_mask``, ``position_ids`` ``[B, P+R]``, ``response_mask [B, R]`` (1 up to and including EOS or the token that completed a stop string),
  ``rollout_log_probs [B, R]`` (float32 log-prob of each sampled token under
  ``softmax(logits / temperature)``, before top-p/top-k; 0 after the end); the prompts'
  non-tensor fields are carried over. ``meta_info["rollout_log_prob_temperature"]`` is the
  temperature of the log-probs (1.0 for greedy decoding) and ``meta_info["rollout_log_probs_exact"]``
  says whether they equal the actor's ``compute_log_prob`` on the same weights to float32
  precision (engines computing in lower precision, or with other kernels, say False).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Protocol, runtime_checkable

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from rlvr.protocol import DataProto
from rlvr.utils.registry import Registry

__all__ = [
    "RolloutEngine", "RolloutFactory", "ROLLOUT_ENGINES", "Weights", "register_rollout_engine", "get_rollout_engine",
    "as_named_tensors", "module_device", "tokenizer_ids",
]

Weights = Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor]


@runtime_checkable
class RolloutEngine(Protocol):
    """What every rollout engine provides."""

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Responses for the prompts (see the module docstring for the keys)."""
        ...

    def update_weights(self, weights: Weights) -> None:
        """Load new policy weights: ``(name, tensor)`` pairs or a state dict with the policy's
        parameter names."""
        ...

    def wake_up(self) -> None:
        """Get ready to generate (weights and cache on the device)."""
        ...

    def sleep(self) -> None:
        """Free generation memory (KV cache; weights the engine owns) for the training phase."""
        ...

    def get_rng_state(self) -> dict:
        """The sampling generator's state (for exact resume)."""
        ...

    def set_rng_state(self, state: dict) -> None:
        """Restore the sampling generator's state."""
        ...


RolloutFactory = Callable[..., RolloutEngine]
"""``factory(config, module, tokenizer, device, seed, owns_module) -> RolloutEngine`` where
``config`` is the ``rollout`` section, ``module`` the policy model to generate with, ``seed`` the
sampling seed of this rank and ``owns_module`` whether the engine holds its own copy of the weights
(True) or shares the actor's module (False)."""

ROLLOUT_ENGINES: Registry[RolloutFactory] = Registry("rollout engine")


def register_rollout_engine(name: str) -> Callable[[RolloutFactory], RolloutFactory]:
    """Decorator registering a rollout engine class (or factory) under ``name``."""
    return ROLLOUT_ENGINES.register(name)


def get_rollout_engine(name: str) -> RolloutFactory:
    """The engine registered under ``name``; an unknown name raises ``KeyError`` listing the valid ones."""
    return ROLLOUT_ENGINES.get(name)


def as_named_tensors(weights: Weights) -> Iterable[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` pairs from either accepted weights form."""
    return weights.items() if isinstance(weights, Mapping) else weights


def module_device(module: nn.Module) -> torch.device:
    """Device of a module's first parameter."""
    return next(module.parameters()).device


def tokenizer_ids(tokenizer: PreTrainedTokenizerBase) -> tuple[list[int], int]:
    """``(eos ids, pad id)`` of a tokenizer (pad falls back to the first EOS)."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("the tokenizer has no eos_token_id; set one (generation could never stop)")
    eos_ids = [eos] if isinstance(eos, int) else list(eos)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]
    return eos_ids, pad
