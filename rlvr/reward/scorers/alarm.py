"""A time limit on a scorer call inside this process, for a scorer that cannot go to a helper process.

``compute_score_timeout`` normally scores in a helper process that is killed at the limit
(:mod:`rlvr.reward.scorers.process_pool`), which needs a picklable ``compute_score``. A function
that cannot be pickled (defined inside another function, a lambda) is limited here instead, as
verl limits every scorer: ``SIGALRM`` interrupts the call when the limit passes. This works only in
the main thread, and only while the scorer runs Python code (a call stuck inside a C extension
returns to Python before the alarm can stop it).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rlvr.reward.scorers.registry import Scorer, ScorerTimeoutError, call_scorer
from rlvr.utils.errors import RewardError

__all__ = ["AlarmLimitedScorer", "alarm_limit"]


@contextmanager
def alarm_limit(seconds: float | None) -> Iterator[None]:
    """Raise :class:`~rlvr.reward.scorers.registry.ScorerTimeoutError` (a ``TimeoutError``) in the
    block when it runs past ``seconds``; None or ``<= 0``: no limit (verl's ``_score_timeout``).

    Raises:
        RewardError: a limit is asked for outside the main thread, where ``SIGALRM`` cannot be
            caught (verl runs the block without a limit there; rlvr says so instead).
    """
    if not seconds or seconds <= 0:
        yield
        return
    if threading.current_thread() is not threading.main_thread():
        raise RewardError(
            "compute_score_timeout with a compute_score that cannot be pickled is enforced with SIGALRM, which "
            "works only in the main thread; score from the main thread, or use a module-level function (then "
            "each sample is scored in a helper process that is killed at the limit)"
        )

    def on_alarm(signum: int, frame: Any) -> None:
        raise ScorerTimeoutError(f"compute_score ran past compute_score_timeout={seconds:g} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class AlarmLimitedScorer:
    """``compute_score`` with a per-call limit of ``timeout_s`` seconds; a call over it raises
    :class:`~rlvr.reward.scorers.registry.ScorerTimeoutError` (a timeout for the reward managers)."""

    def __init__(self, compute_score: Scorer, timeout_s: float) -> None:
        self.compute_score = compute_score
        self.timeout_s = float(timeout_s)

    def __call__(self, **kwargs: Any) -> Any:
        with alarm_limit(self.timeout_s):
            return call_scorer(self.compute_score, kwargs)
