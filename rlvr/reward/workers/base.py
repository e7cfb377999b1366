"""What the reward workers share: the base class, the answer part of a response and the output.

Every reward worker is a :class:`~rlvr.single_controller.base.worker.Worker` with

* ``initialize(pipeline_config)`` — ``Dispatch.ONE_TO_ALL``; loads what the worker needs (a judge
  model, a sandbox); cheap for the rule workers;
* ``compute_rewards(data)`` — ``Dispatch.DP_MP_COMPUTE`` (every worker is its own data-parallel
  rank); returns ``DataProto.from_dict(tensors={"token_level_rewards" [batch, response_len],
  "response_level_rewards" [batch], "scores" [batch]})``, all float32. ``token_level_rewards``
  holds the reward on the last valid response token (zeros elsewhere), ``response_level_rewards``
  the reward, ``scores`` the task score logged as a metric (equal to the reward unless the
  worker says otherwise). Per-sample metric lists go to ``meta_info["metrics"]`` under
  ``reward/<worker metric prefix>/<name>`` (``DataProto.concat`` joins the lists of all ranks).

Input: ``responses [batch, response_len]`` (right-padded), ``response_mask [batch, response_len]``
(or ``attention_mask [batch, prompt_len + response_len]``), ``prompts [batch, prompt_len]``; the
ground truth per sample in ``non_tensor_batch["reward_model"][i]["ground_truth"]`` (the common
format) or ``non_tensor_batch["ground_truth"][i]`` (a plain column, as in
``examples/custom_reward_worker.py``); both are read by :mod:`rlvr.reward.decode`, which also
decodes the responses.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import torch

from rlvr.protocol import DataProto
from rlvr.single_controller.base.decorator import Dispatch, register
from rlvr.single_controller.base.worker import Worker
from rlvr.reward.config import RewardWorkerConfig
from rlvr.reward.decode import decode_responses, ground_truths, last_valid_index, response_mask_of
from rlvr.utils.errors import RewardError
from rlvr.utils.model import DEFAULT_MODEL, load_tokenizer


@dataclass
class ScoredBatch:
    """What a worker's scoring step returns for ``batch`` samples.

    Attributes:
        rewards: ``[batch]`` reward of each sample.
        scores: ``[batch]`` logged score (None: the rewards).
        metrics: metric name (without prefix) -> one value per sample.
    """

    rewards: list[float]
    scores: list[float] | None = None
    metrics: dict[str, list[float]] = field(default_factory=dict)


def split_think(text: str) -> tuple[str, bool]:
    """``(answer, well_formed)``: the text after the last ``</think>`` (the whole text when there is
    no thinking section). A ``<think>`` that is never closed is a format failure: the model has not
    answered yet, so the answer is empty and ``well_formed`` is False."""
    last_open = text.rfind("<think>")
    if last_open >= 0 and "</think>" not in text[last_open:]:
        return "", False
    return text.rsplit("</think>", 1)[-1], True


def build_reward_output(data: DataProto, scored: ScoredBatch, metric_prefix: str) -> DataProto:
    """The workers' output DataProto (see the module docstring) from per-sample rewards."""
    batch_size, response_len = data.batch["responses"].shape
    if len(scored.rewards) != batch_size:
        raise RewardError(f"{metric_prefix} reward worker scored {len(scored.rewards)} samples for a batch of {batch_size}")
    rewards = torch.tensor(scored.rewards, dtype=torch.float32).reshape(batch_size)
    scores = rewards.clone() if scored.scores is None else torch.tensor(scored.scores, dtype=torch.float32).reshape(batch_size)
    token_level = torch.zeros(batch_size, response_len, dtype=torch.float32)
    if batch_size:
        token_level[torch.arange(batch_size), last_valid_index(response_mask_of(data))] = rewards
    metrics = {f"reward/{metric_prefix}/{name}": [float(v) for v in values] for name, values in scored.metrics.items()}
    return DataProto.from_dict(
        tensors={"token_level_rewards": token_level, "response_level_rewards": rewards, "scores": scores},
        meta_info={"metrics": metrics},
    )


class RuleRewardWorker(Worker, ABC):
    """Base of the reward workers: decoding and the output contract; subclasses implement :meth:`score`.

    Args:
        worker_config: a :class:`RewardWorkerConfig` (or a subclass with the worker's own fields).
    """

    metric_prefix = "reward"

    def __init__(self, worker_config: RewardWorkerConfig) -> None:
        super().__init__(worker_config=worker_config)
        self.rank_info.dp_rank = self.rank_info.rank
        self.rank_info.dp_size = self.rank_info.world_size
        self.tokenizer = load_tokenizer(worker_config.tokenizer_path or DEFAULT_MODEL)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def initialize(self, pipeline_config: Any = None) -> None:
        """Prepare the worker; rule workers need nothing (``pipeline_config`` is accepted for the API)."""

    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE, clear_cache=False)
    def compute_rewards(self, data: DataProto) -> DataProto:
        """Rewards of a batch: ``token_level_rewards [batch, response_len]``, ``response_level_rewards
        [batch]``, ``scores [batch]`` (float32)."""
        if len(data) == 0:
            return build_reward_output(data, ScoredBatch([]), self.metric_prefix)
        scored = self.score(decode_responses(data, self.tokenizer), ground_truths(data), data)
        return build_reward_output(data, scored, self.metric_prefix)

    @abstractmethod
    def score(self, responses: list[str], truths: list[Any], data: DataProto) -> ScoredBatch:
        """Score decoded ``responses`` against their ground ``truths`` (``data`` for anything else)."""
