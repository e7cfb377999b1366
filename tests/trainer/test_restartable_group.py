"""A stateless group's handle used from two threads (the asynchronous rollout's and the trainer's):
one failure restarts the group once, every call lands on the new group, and after a shutdown a
failure is raised instead of restarted from."""

from __future__ import annotations

import threading
import time

import pytest

from rlvr.trainer.recovery import Recovery, RestartableGroup
from rlvr.utils.errors import WorkerDiedError, WorkerError


class SlowToStart:
    """A group whose first generation's workers are dead; starting one takes 0.3 s; a call on a
    group that was shut down fails as a worker group does (unusable)."""

    started = 0

    def __init__(self) -> None:
        time.sleep(0.3)
        SlowToStart.started += 1
        self.generation = SlowToStart.started
        self.down = False

    def call(self, tag: str):
        time.sleep(0.05)
        if self.down:
            raise WorkerError("rollout", "call", 0, "the group is unusable since method 'shutdown' failed")
        if self.generation == 1:
            raise WorkerDiedError("rollout", "call", 0, "the worker process died")
        return tag, self.generation

    def shutdown(self) -> None:
        self.down = True


def test_two_threads_see_one_failure_and_one_restart():
    SlowToStart.started = 0
    recovery = Recovery(max_restarts=3)
    handle = RestartableGroup("rollout", SlowToStart, None, recovery, lambda: 4)
    results = {}

    def call(tag: str) -> None:
        results[tag] = handle.run(lambda group: group.call(tag))

    threads = [threading.Thread(target=call, args=(tag,)) for tag in ("generate", "push")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert results == {"generate": ("generate", 2), "push": ("push", 2)}
    assert SlowToStart.started == 2 and len(recovery.restarts) == 1
    assert recovery.restarts[0].restored_step is None


def test_after_shutdown_a_failure_is_raised_until_the_group_is_rebuilt():
    SlowToStart.started = 0
    handle = RestartableGroup("rollout", SlowToStart, None, Recovery(max_restarts=3), lambda: 0)
    handle.shutdown()
    with pytest.raises(WorkerError, match="unusable"):
        handle.run(lambda group: group.call("late"))
    assert SlowToStart.started == 1  # nothing restarted
    handle.rebuild()
    assert handle.run(lambda group: group.call("again")) == ("again", 2)
