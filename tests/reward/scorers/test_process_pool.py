"""The time-limited process pool of the scorers: a worker's start-up (its initializer) does not count
against a task's limit, and a worker that cannot start fails the task with the reason."""

from __future__ import annotations

import functools
import operator
import time

from rlvr.reward.scorers.process_pool import TimeoutProcessPool


def test_initializer_time_is_not_counted_against_the_task_limit():
    with TimeoutProcessPool(num_workers=1, timeout_s=1.0, initializer=functools.partial(time.sleep, 1.5)) as pool:
        (result,) = pool.run(operator.add, [(2, 3)])
        assert (result.status, result.value) == ("ok", 5)
        (slow,) = pool.run(time.sleep, [(3.0,)])  # the task itself still gets the limit
        assert slow.status == "timeout"
        (after,) = pool.run(operator.mul, [(4, 5)])  # a fresh worker, initialised again
        assert (after.status, after.value) == ("ok", 20)


def test_a_worker_that_cannot_start_fails_the_task_with_the_reason():
    with TimeoutProcessPool(num_workers=1, timeout_s=1.0, initializer=functools.partial(operator.truediv, 1, 0)) as pool:
        (result,) = pool.run(operator.add, [(1, 1)])
        assert result.status == "error" and "failed to start: ZeroDivisionError" in result.error
    with TimeoutProcessPool(num_workers=1, timeout_s=1.0, initializer=functools.partial(time.sleep, 30),
                           start_timeout_s=0.5) as pool:
        start = time.monotonic()
        (result,) = pool.run(operator.add, [(1, 1)])
        assert result.status == "error" and "did not start within 0.5 s" in result.error
        assert time.monotonic() - start < 10
