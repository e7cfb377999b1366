"""A reward manager that calls the scorer ONCE per batch, with lists (for scorers that batch
work themselves, e.g. a judge model or a remote service)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rlvr.protocol import DataProto
from rlvr.utils.errors import RewardError
from rlvr.utils.reward_score import ScorerTimeoutError, UnknownDataSourceError, default_compute_score
from rlvr.workers.reward_manager.base import (
    RewardBook,
    check_on_error,
    decode_batch,
    error_policy_kwargs,
    print_examples,
)
from rlvr.workers.reward_manager.registry import register


def default_batch_compute_score(
    data_sources: Sequence[str], solution_strs: Sequence[str], ground_truths: Sequence[Any], extra_infos: Sequence[dict]
) -> list:
    """The batched form of :func:`default_compute_score` (one result per sample)."""
    return [
        default_compute_score(source, solution, truth, extra)
        for source, solution, truth, extra in zip(data_sources, solution_strs, ground_truths, extra_infos)
    ]


@register("batch")
class BatchRewardManager:
    """Score a whole batch with ``compute_score(data_sources=, solution_strs=, ground_truths=,
    extra_infos=, **reward_kwargs) -> list[float | dict | None]`` (one entry per sample).

    A batch scorer that raises fails every sample of the batch: ``on_error=raise`` raises a
    :class:`RewardError` naming the batch size and data sources; ``fallback`` gives every
    sample ``fallback_score`` and counts them as errors (or timeouts for ScorerTimeoutError).

    Args:
        reward_kwargs: extra keyword arguments passed to every call of ``compute_score``.
        (other arguments as in :class:`NaiveRewardManager`)
    """

    def __init__(
        self,
        tokenizer: Any,
        num_examine: int,
        compute_score: Any = None,
        reward_fn_key: str = "data_source",
        on_error: str = "raise",
        fallback_score: float = 0.0,
        **reward_kwargs: Any,
    ) -> None:
        self.tokenizer, self.num_examine = tokenizer, num_examine
        self.compute_score = compute_score or default_batch_compute_score
        self.reward_fn_key, self.reward_kwargs = reward_fn_key, reward_kwargs
        self.on_error, self.fallback_score = check_on_error(on_error), fallback_score

    @classmethod
    def from_config(cls, config: Any, tokenizer: Any, num_examine: int, compute_score: Any, **reward_kwargs: Any):
        return cls(tokenizer, num_examine, compute_score, **{**error_policy_kwargs(config), **reward_kwargs})

    def __call__(self, data: DataProto, return_dict: bool = False) -> torch.Tensor | dict[str, Any]:
        """``token_level_scores [batch, response_len]``, or the dict with extra info and metrics."""
        decoded = decode_batch(data, self.tokenizer, self.reward_fn_key)
        book = RewardBook(decoded.data_sources, self.on_error, self.fallback_score)
        try:
            values = self.compute_score(
                data_sources=decoded.data_sources,
                solution_strs=decoded.responses,
                ground_truths=decoded.ground_truths,
                extra_infos=decoded.extra_infos,
                **self.reward_kwargs,
            )
        except UnknownDataSourceError:
            raise
        except Exception as exc:  # noqa: BLE001 - the whole batch goes through the error policy
            kind = "timeout" if isinstance(exc, ScorerTimeoutError) else "error"
            if self.on_error == "raise":
                raise RewardError(
                    f"batch scorer failed on a batch of {len(data)} samples (data sources "
                    f"{sorted(set(decoded.data_sources))}): {type(exc).__name__}: {exc}"
                ) from exc
            for i in range(len(data)):
                book.fail(i, kind, exc)
        else:
            if len(values) != len(data):
                raise RewardError(f"batch scorer returned {len(values)} scores for a batch of {len(data)} samples")
            for i, value in enumerate(values):
                book.record(i, value)
        print_examples(decoded, book.rewards, self.num_examine)
        return book.output(decoded, return_dict)
