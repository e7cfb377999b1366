"""The default reward manager: score every sample one after another, in the driver process or,
with ``compute_score_timeout``, in a helper process killed when a sample runs past the limit
(or, for a ``compute_score`` that cannot be pickled, in this process under ``SIGALRM``, as verl does).

As verl's naive manager, it gives a sample that runs past the limit a score of 0 and goes on (its
``default_on_error`` is ``fallback_timeouts``; the sample is logged and counted in
``reward/<data_source>/timeouts``); ``reward_model.on_error=raise`` makes a timeout stop the run."""

from __future__ import annotations

from typing import Any

from rlvr.reward.decode import DecodedBatch
from rlvr.reward.managers.base import RewardBook, RewardConfigError, RewardManagerBase, is_picklable, score_serially
from rlvr.reward.managers.registry import register
from rlvr.reward.scorers.alarm import AlarmLimitedScorer, alarm_limit
from rlvr.reward.scorers.process_pool import TimeoutProcessPool


_score_timeout = alarm_limit
"""verl's name of the per-call ``SIGALRM`` limit in this module (:func:`~rlvr.reward.scorers.alarm.alarm_limit`)."""


@register("naive")
class NaiveRewardManager(RewardManagerBase):
    """Score each sample with ``compute_score`` and put it on the last valid response token.

    The other arguments (tokenizer, num_examine, compute_score, reward_fn_key and the keyword-only
    on_error / fallback_score) are those of :class:`~rlvr.reward.managers.base.RewardManagerBase`.

    Args:
        compute_score_timeout: per-sample time limit in seconds; None (default) scores in this
            process without a limit. With a limit every sample is scored in one helper process that is
            killed and replaced when a sample runs past it (the sample then counts as a timeout and
            scores ``fallback_score``, 0.0, unless ``on_error="raise"``), so one pathological answer
            cannot stall training. A ``compute_score``
            that cannot be pickled (a local function) is scored in this process instead and stopped
            by ``SIGALRM`` at the limit (:class:`~rlvr.reward.scorers.alarm.AlarmLimitedScorer`:
            main thread only, Python code only).
    """

    default_on_error = "fallback_timeouts"

    def __init__(self, tokenizer: Any, num_examine: int, compute_score: Any = None, reward_fn_key: str = "data_source",
                 compute_score_timeout: float | None = None, **kwargs: Any) -> None:
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key, **kwargs)
        self.compute_score_timeout = compute_score_timeout
        self.in_process_limit: AlarmLimitedScorer | None = None
        if compute_score_timeout is not None:
            if not compute_score_timeout > 0:
                raise RewardConfigError("reward_model.reward_kwargs.compute_score_timeout",
                                        f"must be > 0 seconds (or None for no limit), got {compute_score_timeout}")
            if is_picklable(self.compute_score):
                self.pool = TimeoutProcessPool(num_workers=1, timeout_s=float(compute_score_timeout))
            else:
                self.in_process_limit = AlarmLimitedScorer(self.compute_score, compute_score_timeout)

    def _score(self, decoded: DecodedBatch, book: RewardBook) -> dict[str, float]:
        if self.in_process_limit is None:
            return super()._score(decoded, book)
        score_serially(self.in_process_limit, decoded, book)
        return {}
