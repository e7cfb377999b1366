"""The default reward manager: score every sample in the driver process, one after another."""

from __future__ import annotations

from typing import Any

import torch

from rlvr.protocol import DataProto
from rlvr.utils.reward_score import default_compute_score
from rlvr.workers.reward_manager.base import (
    RewardBook,
    check_on_error,
    decode_batch,
    error_policy_kwargs,
    print_examples,
    score_serially,
)
from rlvr.workers.reward_manager.registry import register


@register("naive")
class NaiveRewardManager:
    """Score each sample with ``compute_score`` and put it on the last valid response token.

    Args:
        tokenizer: decodes ``prompts`` / ``responses``.
        num_examine: decoded samples printed per data source per call.
        compute_score: ``(data_source, solution_str, ground_truth, extra_info) -> float | dict | None``;
            None uses :func:`rlvr.utils.reward_score.default_compute_score`.
        reward_fn_key: non-tensor field that names the data source.
        on_error: ``raise`` | ``fallback`` for a scorer that raises.
        fallback_score: reward of a failed sample under ``fallback``.
    """

    def __init__(
        self,
        tokenizer: Any,
        num_examine: int,
        compute_score: Any = None,
        reward_fn_key: str = "data_source",
        on_error: str = "raise",
        fallback_score: float = 0.0,
    ) -> None:
        self.tokenizer, self.num_examine = tokenizer, num_examine
        self.compute_score = compute_score or default_compute_score
        self.reward_fn_key = reward_fn_key
        self.on_error, self.fallback_score = check_on_error(on_error), fallback_score

    @classmethod
    def from_config(cls, config: Any, tokenizer: Any, num_examine: int, compute_score: Any, **reward_kwargs: Any):
        return cls(tokenizer, num_examine, compute_score, **{**error_policy_kwargs(config), **reward_kwargs})

    def __call__(self, data: DataProto, return_dict: bool = False) -> torch.Tensor | dict[str, Any]:
        """``token_level_scores [batch, response_len]``, or the dict with extra info and metrics."""
        decoded = decode_batch(data, self.tokenizer, self.reward_fn_key)
        book = RewardBook(decoded.data_sources, self.on_error, self.fallback_score)
        score_serially(self.compute_score, decoded, book)
        print_examples(decoded, book.rewards, self.num_examine)
        return book.output(decoded, return_dict)
