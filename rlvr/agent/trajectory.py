"""Per-sample state of a multi-turn rollout, and the batch tensors built from it.

A trajectory is a prompt (ids, no padding) and a response that grows turn by turn: the ids the
engine sampled (mask 1, with their log-probs) and the ids inserted between turns (tool results,
environment feedback, the chat template's separators; mask 0). The output follows the engine
contract of :mod:`rlvr.workers.rollout.base`, so everything downstream sees a single-turn-shaped
batch::

    responses:         | sampled turn 1 | inserted | sampled turn 2 | pad ... |
    response_mask:     | 1 1 1 ... 1    | 0 ... 0  | 1 1 ... 1      | 0 ...   |
    attention_mask:    | 1 1 1 ... 1    | 1 ... 1  | 1 1 ... 1      | 0 ...   |
    response_versions: | v v v ... v    | -1 ... -1| v' v' ... v'   | -1 ...  |

``attention_mask`` covers every real token (the model reads the inserted ones), ``response_mask``
only the sampled ones (losses, KL, entropy and advantages use it); ``response_versions`` holds the
weights version that sampled each token (turns may come from different versions when the weights
change between rounds, or inside a turn with a partial rollout). ``turn_scores [B, R]`` holds the
rewards given during the rollout (tool step rewards, environment rewards), each on the last
sampled token of the turn it rewards; the trainer adds them to the reward manager's scores.
With images (a vision-language model), ``multi_modal_inputs`` / ``multi_modal_data`` hold every
image of the conversation - the prompt's, then those inserted with observations - in the order of
their image tokens.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from rlvr.protocol import DataProto
from rlvr.utils.multimodal import MULTI_MODAL_DATA, MULTI_MODAL_INPUTS, MultiModalRows
from rlvr.utils.torch_functional import compute_position_ids, left_pad
from rlvr.workers.rollout.base import SESSION_KEY

__all__ = ["Trajectory", "TrajectoryBatch", "STOP_REASONS"]

STOP_REASONS = ("answered", "turn_limit", "response_budget")
"""Why a trajectory ended: the model answered (no more calls / the environment said done), the
turn limit (``multi_turn.max_assistant_turns``) or the response budget (``rollout.response_length``)."""


@dataclass
class Trajectory:
    """One sample's conversation so far (see the module docstring)."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    rewards: list[tuple[int, float]] = field(default_factory=list)
    turn_start: int = 0
    assistant_turns: int = 0
    stop_reason: str | None = None
    counts: dict[str, float] = field(default_factory=dict)
    image_inputs: list[dict[str, torch.Tensor]] = field(default_factory=list)
    images: list[Any] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return self.stop_reason is not None

    def count(self, name: str, amount: float = 1.0) -> None:
        self.counts[name] = self.counts.get(name, 0.0) + amount

    def add_sampled(self, ids: list[int], log_probs: list[float], versions: list[int]) -> None:
        self.response_ids += ids
        self.response_mask += [1] * len(ids)
        self.log_probs += log_probs
        self.versions += versions

    def add_inserted(self, ids: list[int]) -> None:
        self.response_ids += ids
        self.response_mask += [0] * len(ids)
        self.log_probs += [0.0] * len(ids)
        self.versions += [-1] * len(ids)
        self.turn_start = len(self.response_ids)

    def add_images(self, image_inputs: dict[str, torch.Tensor], images: list[Any]) -> None:
        """Images inserted with the last ids (their processor tensors and the images themselves)."""
        if image_inputs:
            self.image_inputs.append(image_inputs)
            self.images += list(images)

    def multi_modal_inputs(self) -> dict[str, torch.Tensor]:
        """The image inputs of the whole conversation, in the order of its image tokens."""
        return MultiModalRows(self.image_inputs).merged()

    def turn_ids(self) -> list[int]:
        """The ids sampled in the current turn (since the last insertion)."""
        return self.response_ids[self.turn_start:]

    def reward_last_token(self, reward: float) -> None:
        """Give ``reward`` to the last sampled token (the end of the current turn)."""
        if reward and 1 in self.response_mask:
            last = len(self.response_mask) - 1 - self.response_mask[::-1].index(1)
            self.rewards.append((last, float(reward)))


class TrajectoryBatch:
    """The trajectories of one ``generate_sequences`` call.

    Args:
        prompts: the engine input (left-padded ``input_ids``/``attention_mask`` ``[B, P]``).
        pad_id: padding id of the output.
    """

    def __init__(self, prompts: DataProto, pad_id: int) -> None:
        ids, mask = prompts.batch["input_ids"], prompts.batch["attention_mask"].bool()
        self.items = [Trajectory(prompt_ids=row[keep].tolist()) for row, keep in zip(ids, mask)]
        self.prompt_width = ids.shape[1]
        self.pad_id = pad_id
        self.session_prefix = uuid.uuid4().hex
        self.had_images = MULTI_MODAL_INPUTS in prompts.non_tensor_batch
        if self.had_images:  # the prompts' images come first
            for item, inputs, data in zip(self.items, prompts.non_tensor_batch[MULTI_MODAL_INPUTS],
                                          prompts.non_tensor_batch[MULTI_MODAL_DATA]):
                item.add_images(inputs or {}, (data or {}).get("image", []))

    def __len__(self) -> int:
        return len(self.items)

    def running(self) -> list[int]:
        return [i for i, item in enumerate(self.items) if not item.done]

    def context_batch(self, rows: list[int], meta_info: dict) -> DataProto:
        """Prompt plus response so far of ``rows``, left-padded, as an engine input ``[b, W]``, with
        each trajectory's ``session_id`` (a server engine keeps its turns on one replica)."""
        contexts = [self.items[i].prompt_ids + self.items[i].response_ids for i in rows]
        ids, mask = left_pad(contexts, max(len(c) for c in contexts), self.pad_id)
        tensors = {"input_ids": ids, "attention_mask": mask, "position_ids": compute_position_ids(mask)}
        non_tensors = {SESSION_KEY: np.array([f"{self.session_prefix}-{i}" for i in rows], dtype=object)}
        if self.has_images:  # each row's images so far, for the engine's prefill
            non_tensors[MULTI_MODAL_INPUTS] = [self.items[i].multi_modal_inputs() for i in rows]
        return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=dict(meta_info))

    @property
    def has_images(self) -> bool:
        return self.had_images or any(item.image_inputs for item in self.items)

    def context_width(self, rows: list[int]) -> int:
        return max(len(self.items[i].prompt_ids) + len(self.items[i].response_ids) for i in rows)

    def to_output(self, prompts: DataProto, response_length: int, meta_info: dict) -> DataProto:
        """The engine-contract output (see the module docstring); the prompts' non-tensor fields are
        carried over and ``num_turns``/``num_tool_calls`` added per sample."""
        width = max(self.prompt_width, max(len(t.prompt_ids) for t in self.items))
        prompt_ids, prompt_mask = left_pad([t.prompt_ids for t in self.items], width, self.pad_id)
        rows = len(self.items)
        responses = torch.full((rows, response_length), self.pad_id, dtype=torch.long)
        response_mask = torch.zeros(rows, response_length, dtype=torch.long)
        attention = torch.zeros(rows, response_length, dtype=torch.long)
        log_probs = torch.zeros(rows, response_length)
        versions = torch.full((rows, response_length), -1, dtype=torch.long)
        turn_scores = torch.zeros(rows, response_length)
        for i, t in enumerate(self.items):
            n = len(t.response_ids)
            responses[i, :n] = torch.tensor(t.response_ids, dtype=torch.long)
            response_mask[i, :n] = torch.tensor(t.response_mask, dtype=torch.long)
            attention[i, :n] = 1
            log_probs[i, :n] = torch.tensor(t.log_probs)
            versions[i, :n] = torch.tensor(t.versions, dtype=torch.long)
            for position, reward in t.rewards:
                turn_scores[i, position] += reward
        prompt_pos = compute_position_ids(prompt_mask)
        response_pos = prompt_pos[:, -1:] + 1 + torch.arange(response_length)
        tensors = {
            "prompts": prompt_ids, "responses": responses,
            "input_ids": torch.cat([prompt_ids, responses], dim=1),
            "attention_mask": torch.cat([prompt_mask, attention], dim=1),
            "position_ids": torch.cat([prompt_pos, response_pos], dim=1),
            "response_mask": response_mask, "rollout_log_probs": log_probs, "response_versions": versions,
            "turn_scores": turn_scores,
        }
        non_tensors = dict(prompts.non_tensor_batch)
        if self.has_images:  # the prompts' images and those inserted, per conversation
            non_tensors[MULTI_MODAL_INPUTS] = [t.multi_modal_inputs() for t in self.items]
            non_tensors[MULTI_MODAL_DATA] = [{"image": list(t.images)} if t.images else {} for t in self.items]
        non_tensors["num_turns"] = np.array([t.assistant_turns for t in self.items], dtype=np.int64)
        non_tensors["num_tool_calls"] = np.array([int(t.counts.get("tool_calls", 0)) for t in self.items],
                                                 dtype=np.int64)
        return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta_info)
