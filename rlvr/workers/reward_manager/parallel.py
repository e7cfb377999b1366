"""A reward manager that scores in worker processes, each sample under a hard time limit.

Use it for scorers that are slow, may hang (symbolic math on adversarial input) or may crash
the interpreter: a sample past ``timeout_s`` has its process killed and replaced, a crashed
process is replaced, and the sample follows ``on_error`` (``reward/<source>/timeouts`` /
``reward/<source>/errors``). The scorer must be picklable (a module-level function, or the
:class:`~rlvr.utils.reward_score.custom.CustomRewardFunction` that a config path produces).
The worker processes live until :meth:`ParallelRewardManager.close` (or interpreter exit).
"""

from __future__ import annotations

import pickle
from typing import Any

from rlvr.utils.errors import RewardError
from rlvr.utils.reward_score import default_compute_score
from rlvr.utils.reward_score.process_pool import TimeoutProcessPool
from rlvr.utils.reward_score.registry import call_scorer_tagged
from rlvr.workers.reward_manager.base import DecodedBatch, RewardBook, RewardManagerBase
from rlvr.workers.reward_manager.registry import register


@register("parallel")
class ParallelRewardManager(RewardManagerBase):
    """Score samples in ``num_workers`` processes with a per-sample limit of ``timeout_s`` seconds.

    Args:
        num_workers: scoring processes (started on the first call).
        timeout_s: wall-clock limit of one sample.
        (other arguments as in :class:`NaiveRewardManager`)
    """

    def __init__(
        self,
        tokenizer: Any,
        num_examine: int,
        compute_score: Any = None,
        reward_fn_key: str = "data_source",
        num_workers: int = 2,
        timeout_s: float = 10.0,
        on_error: str = "raise",
        fallback_score: float = 0.0,
    ) -> None:
        self._init_common(
            tokenizer, num_examine, compute_score or default_compute_score, reward_fn_key, on_error, fallback_score
        )
        try:
            pickle.dumps(self.compute_score)
        except Exception as exc:  # noqa: BLE001 - any pickling failure means the same fix
            raise RewardError(
                f"the parallel reward manager sends compute_score to its worker processes, but {self.compute_score!r} "
                f"cannot be pickled ({exc}); use a module-level function or custom_reward_function.path/name"
            ) from exc
        self.pool = TimeoutProcessPool(num_workers=num_workers, timeout_s=timeout_s)

    @classmethod
    def config_kwargs(cls, config: Any) -> dict[str, Any]:
        return {"num_workers": config.reward_model.num_workers, "timeout_s": config.reward_model.timeout_s}

    def _score(self, decoded: DecodedBatch, book: RewardBook) -> dict[str, float]:
        """Each sample in a worker process under ``timeout_s``; a crash or timeout follows ``on_error``."""
        tasks = [
            (
                self.compute_score,
                {
                    "data_source": decoded.data_sources[i],
                    "solution_str": response,
                    "ground_truth": decoded.ground_truths[i],
                    "extra_info": decoded.extra_infos[i],
                },
            )
            for i, response in enumerate(decoded.responses)
        ]
        for i, result in enumerate(self.pool.run(call_scorer_tagged, tasks)):
            if result.status != "ok":
                book.fail(i, result.status, result.error)
                continue
            tag, value = result.value
            if tag == "unknown":
                raise RewardError(value)
            if tag == "timeout":
                book.fail(i, "timeout", value)
            else:
                book.record(i, value)
        return {}

    def close(self) -> None:
        """Stop the scoring processes (a later call starts new ones)."""
        self.pool.close()

    def __enter__(self) -> ParallelRewardManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
