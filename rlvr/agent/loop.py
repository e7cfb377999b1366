"""Agent loops: how a batch of prompts becomes trajectories, on top of any rollout engine.

An agent loop takes the rollout engine and a batch of prompts and returns what an engine returns
(:mod:`rlvr.workers.rollout.base`), so rewards, advantages and losses see the same batch as for
single-turn work. Loops register under a name (``@register_agent_loop("name")``, a factory
``(rollout_config, tokenizer) -> loop``, given ``processor=`` too with a vision-language model); each
row runs the loop named by its ``agent_name`` field (as in verl), or
``actor_rollout_ref.rollout.agent.default_agent_loop``:

- ``single_turn``: the engine's ``generate_sequences`` on the prompts, untouched (the same results
  as calling the engine directly);
- ``tool_agent``: the model calls tools between turns (:mod:`rlvr.agent.tool_agent`);
- ``env_agent``: the model talks to a gym-style environment (:mod:`rlvr.agent.env_agent`).

:class:`AgentLoopManager` is what the hybrid worker's ``generate_sequences`` calls: on the local and
the Ray backend alike, with whatever engine the worker holds.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase, ProcessorMixin

from rlvr.protocol import DataProto
from rlvr.utils.registry import Registry
from rlvr.workers.rollout.base import RolloutEngine, tokenizer_ids

__all__ = ["AgentLoop", "AGENT_LOOPS", "register_agent_loop", "get_agent_loop", "AgentLoopManager",
           "SingleTurnAgentLoop", "AGENT_NAME_KEY", "expand_samples"]

AGENT_NAME_KEY = "agent_name"
"""Non-tensor field naming a row's agent loop (None or absent: the default loop)."""


class AgentLoop(Protocol):
    """Turns prompts into trajectories with a rollout engine."""

    def generate_sequences(self, engine: RolloutEngine, prompts: DataProto) -> DataProto:
        """The engine-contract output for ``prompts`` (see :mod:`rlvr.workers.rollout.base`)."""
        ...


AgentLoopFactory = Callable[..., AgentLoop]
"""``factory(rollout_config, tokenizer) -> AgentLoop``: ``rollout_config`` is the
``actor_rollout_ref.rollout`` section (lengths, ``agent``, ``multi_turn``). With a vision-language
model the factory also gets ``processor=`` (its multimodal processor, for loops that insert images)."""

AGENT_LOOPS: Registry[AgentLoopFactory] = Registry("agent loop")


def register_agent_loop(name: str) -> Callable[[AgentLoopFactory], AgentLoopFactory]:
    """Decorator registering an agent loop class (or factory) under ``name``."""
    return AGENT_LOOPS.register(name)


def get_agent_loop(name: str) -> AgentLoopFactory:
    """The loop registered under ``name``; an unknown name raises ``KeyError`` listing the valid ones."""
    return AGENT_LOOPS.get(name)


@register_agent_loop("single_turn")
class SingleTurnAgentLoop:
    """One model turn per prompt: the engine's own ``generate_sequences``."""

    def __init__(self, rollout_config: Any, tokenizer: PreTrainedTokenizerBase,
                 processor: ProcessorMixin | None = None) -> None:
        return None

    def generate_sequences(self, engine: RolloutEngine, prompts: DataProto) -> DataProto:
        return engine.generate_sequences(prompts)


AGENT_LOOPS.add("single_turn_agent", SingleTurnAgentLoop)  # verl's name (config and the data's agent_name)


def expand_samples(prompts: DataProto) -> DataProto:
    """``prompts`` with every row repeated ``meta_info["n"]`` times (adjacent) and ``n`` removed from
    ``meta_info``: what an engine does with ``n`` (multi-turn loops need one row per sample)."""
    repeat = int(prompts.meta_info.get("n", 1))
    expanded = prompts.repeat(repeat, interleave=True) if repeat > 1 else prompts.select()
    expanded.meta_info = {key: value for key, value in prompts.meta_info.items() if key != "n"}
    return expanded


class AgentLoopManager:
    """Runs every row's agent loop (``agent_name``, else the default) and joins the results in row order.

    Args:
        rollout_config: the ``actor_rollout_ref.rollout`` section.
        tokenizer: the policy's tokenizer.
        processor: the model's multimodal processor (None for a text model): passed to the loops as
            ``processor=`` when there is one.

    The default loop is built here, so its configuration errors (a missing tools file) show at start-up;
    other loops are built the first time a row asks for them.
    """

    def __init__(self, rollout_config: Any, tokenizer: PreTrainedTokenizerBase,
                 processor: ProcessorMixin | None = None) -> None:
        self.rollout_config = rollout_config
        self.tokenizer = tokenizer
        self.extra = {} if processor is None else {"processor": processor}
        self.default_name = str(rollout_config.agent.default_agent_loop)
        self._loops: dict[str, AgentLoop] = {}
        self._loop(self.default_name)

    def _loop(self, name: str) -> AgentLoop:
        if name not in self._loops:
            self._loops[name] = get_agent_loop(name)(self.rollout_config, self.tokenizer, **self.extra)
        return self._loops[name]

    def _names(self, prompts: DataProto) -> list[str]:
        column = prompts.non_tensor_batch.get(AGENT_NAME_KEY)
        if column is None:
            return [self.default_name] * len(prompts)
        names = [self.default_name if name is None else str(name) for name in column]
        for row, name in enumerate(names):
            if not AGENT_LOOPS.has(name):
                raise KeyError(f"row {row} has agent_name={name!r}, which is not a registered agent loop; "
                               f"valid names: {', '.join(AGENT_LOOPS.names())}")
        return names

    def generate_sequences(self, engine: RolloutEngine, prompts: DataProto) -> DataProto:
        """Trajectories for ``prompts`` (``meta_info["n"]`` rows per prompt if given)."""
        names = self._names(prompts)
        if len(set(names)) == 1:
            return self._loop(names[0]).generate_sequences(engine, prompts)
        repeat = int(prompts.meta_info.get("n", 1))
        prompts = expand_samples(prompts)
        names = [name for name in names for _ in range(repeat)]
        rows_of: dict[str, list[int]] = defaultdict(list)
        for row, name in enumerate(names):
            rows_of[name].append(row)
        parts = [self._loop(name).generate_sequences(engine, prompts.select_idxs(rows))
                 for name, rows in rows_of.items()]
        order = [row for rows in rows_of.values() for row in rows]
        pad_id = int(prompts.meta_info.get("pad_token_id", tokenizer_ids(self.tokenizer)[1]))
        merged = DataProto.concat(_aligned(parts, pad_id))
        position = np.empty(len(order), dtype=np.int64)
        position[order] = np.arange(len(order))
        merged.reorder(torch.from_numpy(position))
        return merged


def _aligned(parts: list[DataProto], pad_id: int) -> list[DataProto]:
    """The loops' outputs made concatenable: prompts left-padded to one width, tensor keys a part lacks
    filled with zeros, non-tensor keys a part lacks filled with None."""
    width = max(part.batch["prompts"].shape[1] for part in parts)
    tensor_keys = {key: part.batch[key] for part in parts for key in part.batch.keys()}
    non_tensor_keys = {key for part in parts for key in part.non_tensor_batch}
    aligned = []
    for part in parts:
        tensors = _left_pad_prompts(dict(part.batch.items()), width, pad_id)
        rows = len(part)
        for key, example in tensor_keys.items():
            if key not in tensors:
                tensors[key] = torch.zeros((rows, *example.shape[1:]), dtype=example.dtype)
        non_tensors = dict(part.non_tensor_batch)
        for key in non_tensor_keys - set(non_tensors):
            non_tensors[key] = np.full(rows, None, dtype=object)
        aligned.append(DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=part.meta_info))
    return aligned


def _left_pad_prompts(tensors: dict[str, torch.Tensor], width: int, pad_id: int) -> dict[str, torch.Tensor]:
    """Widen the prompt part of ``prompts``, ``input_ids``, ``attention_mask``, ``position_ids`` to ``width``."""
    extra = width - tensors["prompts"].shape[1]
    if extra == 0:
        return tensors
    rows = tensors["prompts"].shape[0]
    pads = {"prompts": pad_id, "input_ids": pad_id, "attention_mask": 0, "position_ids": 0}
    for key, value in pads.items():
        tensors[key] = torch.cat([torch.full((rows, extra), value, dtype=tensors[key].dtype), tensors[key]], dim=1)
    return tensors
