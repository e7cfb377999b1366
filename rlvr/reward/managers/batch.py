"""A reward manager that calls the scorer ONCE per batch, with lists (for scorers that batch
work themselves, e.g. a judge model or a remote service)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlvr.utils.errors import RewardError
from rlvr.reward.scorers import UnknownDataSourceError, default_compute_score
from rlvr.reward.decode import DecodedBatch
from rlvr.reward.managers.base import RewardBook, RewardManagerBase
from rlvr.reward.managers.registry import register


def default_batch_compute_score(
    data_sources: Sequence[str], solution_strs: Sequence[str], ground_truths: Sequence[Any], extra_infos: Sequence[dict]
) -> list:
    """The batched form of :func:`default_compute_score` (one result per sample)."""
    return [
        default_compute_score(source, solution, truth, extra)
        for source, solution, truth, extra in zip(data_sources, solution_strs, ground_truths, extra_infos)
    ]


@register("batch")
class BatchRewardManager(RewardManagerBase):
    """Score a whole batch with ``compute_score(data_sources=, solution_strs=, ground_truths=,
    extra_infos=, **reward_kwargs) -> list[float | dict | None]`` (one entry per sample).

    A batch scorer that raises fails every sample of the batch: ``on_error=raise`` lets its
    exception propagate with a note naming the batch size and data sources; ``fallback`` gives every
    sample ``fallback_score`` and counts them as errors (or timeouts for a ``TimeoutError``). The
    other arguments are those of :class:`~rlvr.reward.managers.base.RewardManagerBase`.

    Args:
        reward_kwargs: extra keyword arguments passed to every call of ``compute_score``.
    """

    default_compute_score = staticmethod(default_batch_compute_score)

    def __init__(self, tokenizer: Any, num_examine: int, compute_score: Any = None, reward_fn_key: str = "data_source",
                 *, on_error: str | None = None, fallback_score: float = 0.0, **reward_kwargs: Any) -> None:
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key, on_error=on_error,
                         fallback_score=fallback_score)
        self.reward_kwargs = reward_kwargs

    def _score(self, decoded: DecodedBatch, book: RewardBook) -> dict[str, float]:
        """One ``compute_score`` call for the whole batch; a failure fails every sample."""
        size = len(decoded.responses)
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
            kind = "timeout" if isinstance(exc, TimeoutError) else "error"
            if not book.falls_back(kind):
                exc.add_note(f"(the batch scorer failed on a batch of {size} samples, data sources "
                             f"{sorted(set(decoded.data_sources))}; set reward_model.on_error=fallback to give them "
                             "reward_model.fallback_score instead)")
                raise
            for i in range(size):
                book.fail(i, kind, exc)
        else:
            if len(values) != size:
                raise RewardError(f"batch scorer returned {len(values)} scores for a batch of {size} samples")
            for i, value in enumerate(values):
                book.record(i, value)
        return {}
