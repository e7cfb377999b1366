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

import torch

from rlvr.protocol import DataProto
from rlvr.utils.errors import RewardError
from rlvr.utils.reward_score import default_compute_score
from rlvr.utils.reward_score.process_pool import TimeoutProcessPool
from rlvr.utils.reward_score.registry import call_scorer_tagged
from rlvr.workers.reward_manager.base import (
    DecodedBatch,
    RewardBook,
    check_on_error,
    decode_batch,
    error_policy_kwargs,
    print_examples,
)
from rlvr.workers.reward_manager.registry import register


@register("parallel")
class ParallelRewardManager:
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
        self.tokenizer, self.num_examine = tokenizer, num_examine
        self.compute_score = compute_score or default_compute_score
        self.reward_fn_key = reward_fn_key
        self.on_error, self.fallback_score = check_on_error(on_error), fallback_score
        try:
            pickle.dumps(self.compute_score)
        except Exception as exc:  # noqa: BLE001 - any pickling failure means the same fix
            raise RewardError(
                f"the parallel reward manager sends compute_score to its worker processes, but {self.compute_score!r} "
                f"cannot be pickled ({exc}); use a module-level function or custom_reward_function.path/name"
            ) from exc
        self.pool = TimeoutProcessPool(num_workers=num_workers, timeout_s=timeout_s)

    @classmethod
    def from_config(cls, config: Any, tokenizer: Any, num_examine: int, compute_score: Any, **reward_kwargs: Any):
        kwargs = {
            "num_workers": config.reward_model.num_workers,
            "timeout_s": config.reward_model.timeout_s,
            **error_policy_kwargs(config),
            **reward_kwargs,
        }
        return cls(tokenizer, num_examine, compute_score, **kwargs)

    def _score(self, decoded: DecodedBatch, book: RewardBook) -> None:
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

    def __call__(self, data: DataProto, return_dict: bool = False) -> torch.Tensor | dict[str, Any]:
        """``token_level_scores [batch, response_len]``, or the dict with extra info and metrics."""
        decoded = decode_batch(data, self.tokenizer, self.reward_fn_key)
        book = RewardBook(decoded.data_sources, self.on_error, self.fallback_score)
        self._score(decoded, book)
        print_examples(decoded, book.rewards, self.num_examine)
        return book.output(decoded, return_dict)

    def close(self) -> None:
        """Stop the scoring processes (a later call starts new ones)."""
        self.pool.close()

    def __enter__(self) -> ParallelRewardManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
