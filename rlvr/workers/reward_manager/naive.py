"""The default reward manager: score every sample in the driver process, one after another."""

from __future__ import annotations

from typing import Any

from rlvr.utils.reward_score import default_compute_score
from rlvr.workers.reward_manager.base import RewardManagerBase
from rlvr.workers.reward_manager.registry import register


@register("naive")
class NaiveRewardManager(RewardManagerBase):
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
        self._init_common(
            tokenizer, num_examine, compute_score or default_compute_score, reward_fn_key, on_error, fallback_score
        )
