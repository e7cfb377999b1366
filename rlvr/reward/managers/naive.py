"""The default reward manager: score every sample one after another, in the driver process or,
with ``compute_score_timeout``, in a helper process killed when a sample runs past the limit."""

from __future__ import annotations

from typing import Any

from rlvr.reward.managers.base import RewardConfigError, RewardManagerBase, check_picklable
from rlvr.reward.managers.registry import register
from rlvr.reward.scorers.process_pool import TimeoutProcessPool


@register("naive")
class NaiveRewardManager(RewardManagerBase):
    """Score each sample with ``compute_score`` and put it on the last valid response token.

    Args:
        compute_score_timeout: per-sample time limit in seconds; None (default) scores in this
            process without a limit. With a limit every sample is scored in one helper process that is
            killed and replaced when a sample runs past it (the sample then counts as a timeout,
            see ``on_error``), so one pathological answer cannot stall training; ``compute_score``
            must then be picklable.
        (tokenizer, num_examine, compute_score, reward_fn_key and the keyword-only on_error /
        fallback_score as in :class:`~rlvr.reward.managers.base.RewardManagerBase`)
    """

    def __init__(self, tokenizer: Any, num_examine: int, compute_score: Any = None, reward_fn_key: str = "data_source",
                 compute_score_timeout: float | None = None, **kwargs: Any) -> None:
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key, **kwargs)
        self.compute_score_timeout = compute_score_timeout
        if compute_score_timeout is not None:
            if not compute_score_timeout > 0:
                raise RewardConfigError("reward_model.reward_kwargs.compute_score_timeout",
                                        f"must be > 0 seconds (or None for no limit), got {compute_score_timeout}")
            check_picklable(self.compute_score, "compute_score_timeout scores every sample in a helper process")
            self.pool = TimeoutProcessPool(num_workers=1, timeout_s=float(compute_score_timeout))
