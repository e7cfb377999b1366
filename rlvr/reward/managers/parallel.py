"""A reward manager that scores in worker processes, each sample under a hard time limit.

Use it for scorers that are slow, may hang (symbolic math on adversarial input) or may crash
the interpreter: a sample past ``timeout_s`` has its process killed and replaced, a crashed
process is replaced, and the sample follows ``on_error`` (``reward/<source>/timeouts`` /
``reward/<source>/errors``). The scorer must be picklable (a module-level function, or the
:class:`~rlvr.reward.scorers.custom.CustomRewardFunction` that a config path produces).
The worker processes live until :meth:`ParallelRewardManager.close` (or interpreter exit).
"""

from __future__ import annotations

from typing import Any

from rlvr.reward.managers.base import RewardManagerBase, check_picklable
from rlvr.reward.managers.registry import register
from rlvr.reward.scorers.process_pool import TimeoutProcessPool


@register("parallel")
class ParallelRewardManager(RewardManagerBase):
    """Score samples in ``num_workers`` processes with a per-sample limit of ``timeout_s`` seconds.
    The other arguments are those of :class:`~rlvr.reward.managers.base.RewardManagerBase`.

    Args:
        num_workers: scoring processes (started on the first call).
        timeout_s: wall-clock limit of one sample.
    """

    def __init__(self, tokenizer: Any, num_examine: int, compute_score: Any = None, reward_fn_key: str = "data_source",
                 num_workers: int = 2, timeout_s: float = 10.0, **kwargs: Any) -> None:
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key, **kwargs)
        check_picklable(self.compute_score, "the parallel reward manager sends compute_score to its worker processes")
        self.pool = TimeoutProcessPool(num_workers=num_workers, timeout_s=timeout_s)

    @classmethod
    def config_kwargs(cls, config: Any) -> dict[str, Any]:
        return {"num_workers": config.reward_model.num_workers, "timeout_s": config.reward_model.timeout_s}
