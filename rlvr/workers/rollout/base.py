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
- one optional non-tensor input field, ``session_id`` (:data:`SESSION_KEY`): rows with the same value
  belong to one multi-turn trajectory; a server engine sends them to the same replica (its prefix
  cache holds the context). In-process engines ignore it.
- one response per row unless ``meta_info["n"]`` asks for more: the trainer repeats the prompts
  itself (``batch.repeat(rollout.n, interleave=True)``, as verl does), so ``rollout.n`` in the
  config is not applied by the engine.
- output: ``prompts [B, P]``, ``responses [B, R]`` (right-padded with the pad id, ``R =
  meta_info["response_length"]`` if given, else ``rollout.response_length``), ``input_ids``,
  ``attention_mask``, ``position_ids`` ``[B, P+R]``, ``response_mask [B, R]`` (1 up to and including
  EOS or the token that completed a stop string),
  ``rollout_log_probs [B, R]`` (float32 log-prob of each sampled token under
  ``softmax(logits / temperature)``, before top-p/top-k; 0 after the end); the prompts'
  non-tensor fields are carried over. ``meta_info["rollout_log_prob_temperature"]`` is the
  temperature of the log-probs (1.0 for greedy decoding) and ``meta_info["rollout_log_probs_exact"]``
  says whether they equal the actor's ``compute_log_prob`` on the same weights to float32
  precision (engines computing in lower precision, or with other kernels, say False).
  ``meta_info["rollout_weights_version"]`` is the version of the weights the engine generated with
  (the ``version`` of its last :meth:`RolloutEngine.update_weights`); the trainer refuses samples
  whose version is not the actor's current one (a silently stale engine).
  ``response_versions [B, R]`` (int64) is the weights version that sampled each response token, and
  -1 where ``response_mask`` is 0 (padding; tokens an agent loop inserts). An in-process engine
  writes its ``weights_version`` on every sampled token; a server engine writes what the server
  reports per token span; with a partial rollout (below) the versions change along a row. The
  asynchronous trainer measures staleness from them (:mod:`rlvr.trainer.async_schedule`).
- partial rollouts, for engines whose factory says ``interruptible = True``: the per-call key
  ``meta_info["interrupt"]`` (a ``threading.Event``, in-process only) asks the engine to stop
  decoding at its next step once the event is set (new weights are waiting). The tokens sampled so
  far are returned as usual, with their log-probs and version, and ``meta_info["interrupted_rows"]``
  lists the rows cut short (``[]`` when the event was never set); every other row is finished.
  :class:`~rlvr.workers.rollout.partial.PartialRollout` loads the new weights and continues the cut
  rows from where they stopped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from rlvr.protocol import DataProto
from rlvr.utils.errors import StaleRolloutError
from rlvr.utils.registry import Registry
from rlvr.workers.rollout.sampling import SamplingParams, resolve_sampling

__all__ = [
    "RolloutEngine", "RolloutFactory", "ROLLOUT_ENGINES", "Weights", "register_rollout_engine", "get_rollout_engine",
    "as_named_tensors", "module_device", "tokenizer_ids", "CallSettings", "call_settings", "response_tensors",
    "check_weights_version", "SESSION_KEY",
]

SESSION_KEY = "session_id"
"""Optional non-tensor input field naming the multi-turn trajectory of a row (see the module docstring)."""

Weights = Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor]


@runtime_checkable
class RolloutEngine(Protocol):
    """What every rollout engine provides."""

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Responses for the prompts (see the module docstring for the keys)."""
        ...

    weights_version: int
    """Version of the weights the engine holds (set by :meth:`update_weights`; 0 at construction)."""

    def update_weights(self, weights: Weights, version: int) -> dict[str, float] | None:
        """Load new policy weights, ``(name, tensor)`` pairs or a state dict with the policy's
        parameter names, in place; afterwards ``weights_version == version``. An engine whose sync
        has stages (a server engine: write, pause, reload, ...) returns their seconds, else None."""
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


class RolloutFactory(Protocol):
    """``factory(config, module, tokenizer, device, seed, owns_module) -> RolloutEngine`` where
    ``config`` is the ``rollout`` section, ``module`` the policy model, ``seed`` the sampling seed of
    this rank and ``owns_module`` whether the engine holds its own copy of the weights (True) or
    shares the actor's module (False)."""

    runs_torch_module: bool
    """True: the engine generates with ``module`` itself (one rank shares the actor's module, nothing
    to copy); False: it keeps its own copy of the weights (``module`` only describes the policy) and
    needs :meth:`RolloutEngine.update_weights` after every actor update."""

    interruptible: bool
    """True: ``generate_sequences`` honours ``meta_info["interrupt"]`` (see the module docstring), so
    the engine can run partial rollouts (``async_training.partial_rollout``)."""

    def __call__(self, config, module: nn.Module, tokenizer: PreTrainedTokenizerBase, device: str | torch.device,
                 seed: int, owns_module: bool) -> RolloutEngine: ...

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


@dataclass(frozen=True)
class CallSettings:
    """How one ``generate_sequences`` call generates.

    Attributes:
        sampling: the sampling settings (``rollout`` or ``rollout.val_kwargs``, overridden by the call).
        eos_ids: ids that end a row (the tokenizer's, or ``meta_info["eos_token_id"]``).
        pad_id: id that pads the responses (the tokenizer's, or ``meta_info["pad_token_id"]``).
        response_length: ``R``, the response width (``meta_info["response_length"]`` or the config's).
        stop: stop strings (``meta_info["stop"]`` or ``rollout.stop``).
    """

    sampling: SamplingParams
    eos_ids: list[int]
    pad_id: int
    response_length: int
    stop: list[str]


def call_settings(config, tokenizer: PreTrainedTokenizerBase, prompts: DataProto) -> tuple[DataProto, CallSettings]:
    """The prompts of one call (each row repeated ``meta_info["n"]`` times) and its settings.

    Raises:
        ValueError: ``meta_info["response_length"]`` outside ``[1, rollout.response_length]``.
    """
    meta = prompts.meta_info
    repeat = int(meta.get("n", 1))
    if repeat > 1:
        prompts = prompts.repeat(repeat, interleave=True)
    eos_ids, pad_id = tokenizer_ids(tokenizer)
    if meta.get("eos_token_id") is not None:
        eos = meta["eos_token_id"]
        eos_ids = [eos] if isinstance(eos, int) else list(eos)
    if meta.get("pad_token_id") is not None:
        pad_id = int(meta["pad_token_id"])
    response_length = int(meta.get("response_length", config.response_length))
    if not 1 <= response_length <= int(config.response_length):
        raise ValueError(f"meta_info['response_length']={response_length} must be in [1, rollout.response_length="
                         f"{config.response_length}]")
    stop = [str(s) for s in meta.get("stop", config.stop)]
    return prompts, CallSettings(resolve_sampling(config, meta), eos_ids, pad_id, response_length, stop)


def response_tensors(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                     responses: torch.Tensor, response_mask: torch.Tensor, log_probs: torch.Tensor,
                     versions: torch.Tensor | int) -> dict[str, torch.Tensor]:
    """The output tensors of ``generate_sequences`` from the prompts ``[b, P]`` and the right-padded
    responses, their mask and sampling log-probs ``[b, R]`` (all on CPU); response positions
    continue each row's prompt positions. ``versions`` is the weights version of each response
    token ``[b, R]``, or one version for every sampled token; ``response_versions`` is -1 where
    ``response_mask`` is 0."""
    response_pos = position_ids[:, -1:] + 1 + torch.arange(responses.shape[1], dtype=position_ids.dtype)
    versions = torch.as_tensor(versions, dtype=torch.long).expand(responses.shape)
    return {
        "prompts": input_ids,
        "responses": responses,
        "input_ids": torch.cat([input_ids, responses], dim=1),
        "attention_mask": torch.cat([attention_mask, response_mask.to(attention_mask.dtype)], dim=1),
        "position_ids": torch.cat([position_ids, response_pos], dim=1),
        "response_mask": response_mask.to(attention_mask.dtype),
        "rollout_log_probs": log_probs,
        "response_versions": torch.where(response_mask.bool(), versions, -1),
    }


def tokenizer_ids(tokenizer: PreTrainedTokenizerBase) -> tuple[list[int], int]:
    """``(eos ids, pad id)`` of a tokenizer (pad falls back to the first EOS)."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("the tokenizer has no eos_token_id; set one (generation could never stop)")
    eos_ids = [eos] if isinstance(eos, int) else list(eos)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]
    return eos_ids, pad


def check_weights_version(meta_info: Mapping, engine_name: str = "the rollout engine") -> None:
    """Refuse samples that the engine generated with other weights than the actor's current ones:
    ``meta_info["rollout_weights_version"]`` (the engine's) against ``meta_info["actor_weights_version"]``
    (set by a hybrid worker; without an actor there is nothing to compare). ``engine_name`` says which
    engine in the error (a worker names its engine and rank).

    Raises:
        StaleRolloutError: the versions differ (a silently stale engine).
    """
    actor = meta_info.get("actor_weights_version")
    if actor is None:
        return
    engine = meta_info["rollout_weights_version"]
    if engine != actor:
        raise StaleRolloutError(
            f"{engine_name} generated these samples with weights version {engine}, but the actor is at "
            f"version {actor}: the weight sync after an actor update did not reach the engine, so the samples "
            "come from an old policy and training on them would be silently off-policy. Refusing to train; "
            "check the rollout engine's update_weights (actor_rollout_ref.rollout.name)")
