"""A custom rule-based reward worker, written from scratch on the reward-worker protocol
(``initialize`` / ``compute_rewards``; rlvr's own workers subclass ``rlvr.reward.workers.RuleRewardWorker``).

Only the import paths and the worker's config object are rlvr's. ``initialize`` runs once on every
worker (``Dispatch.ONE_TO_ALL``); ``compute_rewards`` gets the batch split by data-parallel rank
(``Dispatch.DP_MP_COMPUTE``) and returns ``token_level_rewards [batch, response_len]``,
``response_level_rewards [batch]`` and ``scores [batch]``.

Run it through a 2-worker ``RayWorkerGroup`` with ``python examples/run_custom_reward_worker.py``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from rlvr.protocol import DataProto
from rlvr.single_controller.base.decorator import Dispatch, register
from rlvr.single_controller.base.worker import Worker
from rlvr.utils.testing import tiny_tokenizer
from rlvr.utils.tokenizer import hf_tokenizer

BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


@dataclass
class ModelArgs:
    """Which tokenizer the reward worker decodes responses with."""

    tokenizer_name_or_path: str = field(
        default="smollm2-135m-instruct",
        metadata={"help": "model alias, hub id or folder of the tokenizer; 'tiny' = rlvr's byte-level test tokenizer"},
    )


@dataclass
class WorkerConfig:
    """Config of the custom reward worker."""

    model_args: ModelArgs = field(default_factory=ModelArgs, metadata={"help": "tokenizer to decode with"})


def default_tokenizer_provider(model_args: ModelArgs) -> PreTrainedTokenizerBase:
    """The tokenizer named by ``model_args``."""
    if model_args.tokenizer_name_or_path == "tiny":
        return tiny_tokenizer()
    return hf_tokenizer(model_args.tokenizer_name_or_path)


class CustomRewardWorker(Worker):
    def __init__(self, worker_config: WorkerConfig):
        super().__init__(worker_config=worker_config)
        # rank info: every worker is its own data-parallel rank
        self.rank_info.dp_rank = self.rank_info.rank
        self.rank_info.dp_size = self.rank_info.world_size
        # tokenizer
        self.tokenizer = default_tokenizer_provider(model_args=self.worker_config.model_args)
        # custom reward function
        self.custom_reward_fn = self._create_custom_reward_function()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def initialize(self, pipeline_config: Any = None) -> None:
        """Runs once on every worker. A rule-based worker has no model to load; a model-based one
        would initialise its inference strategy here and offload it until the first call."""

    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE, clear_cache=False)
    def compute_rewards(self, data: DataProto) -> DataProto:
        """Core reward computation.

        Args:
            data: ``responses [batch, response_len]`` and non-tensor ``ground_truth [batch]``.

        Returns:
            ``token_level_rewards [batch, response_len]`` (zeros: the reward is per response),
            ``response_level_rewards [batch]`` and ``scores [batch]``, float16.
        """
        # 1. decode the responses
        response_text_list = self.tokenizer.batch_decode(data.batch["responses"], skip_special_tokens=False)
        # 2. ground truth
        ground_truths = data.non_tensor_batch["ground_truth"]
        # 3. rewards
        rewards = []
        for response, ground_truth in zip(response_text_list, ground_truths):
            reward = self.custom_reward_fn(response, ground_truth)
            rewards.append(reward)
        # 4. result
        token_level_rewards = torch.zeros_like(data.batch["responses"], dtype=torch.float16)
        response_level_rewards = torch.tensor(rewards, dtype=torch.float16)
        return DataProto.from_dict(
            tensors={
                "token_level_rewards": token_level_rewards,
                "response_level_rewards": response_level_rewards,
                "scores": response_level_rewards,
            }
        )

    def _create_custom_reward_function(self) -> Callable[[str, str], float]:
        return self._compute_single_reward

    def _compute_single_reward(self, response: str, ground_truth: str) -> float:
        """Correct answer +1, ``\\boxed{}`` format +0.5, minus a repetition penalty."""
        response = response.replace("<|endoftext|>", "").replace("<|im_end|>", "").replace("<pad>", "")
        reward = 0.0
        if self._check_answer_correctness(response, ground_truth):
            reward += 1.0
        if self._check_format_correctness(response):
            reward += 0.5
        reward += self._compute_repetition_penalty(response)
        return reward

    def _check_answer_correctness(self, response: str, ground_truth: str) -> bool:
        """The last ``\\boxed{...}`` equals the ground truth (ignoring spaces, ``$`` and a final ``.``)."""
        answers = BOXED.findall(response)
        return bool(answers) and _normalize(answers[-1]) == _normalize(ground_truth)

    def _check_format_correctness(self, response: str) -> bool:
        """The response states its answer in exactly one ``\\boxed{...}``."""
        return len(BOXED.findall(response)) == 1

    def _compute_repetition_penalty(self, response: str) -> float:
        """``-0.5 * (1 - distinct / total)`` over the word 3-grams; 0 with fewer than 3 words."""
        words = response.split()
        trigrams = [tuple(words[i : i + 3]) for i in range(len(words) - 2)]
        if not trigrams:
            return 0.0
        return -0.5 * (1.0 - len(set(trigrams)) / len(trigrams))


def _normalize(answer: str) -> str:
    return answer.replace(" ", "").replace("$", "").rstrip(".")
