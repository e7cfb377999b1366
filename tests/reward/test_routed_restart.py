"""A routed reward worker reached through a restartable handle: a dead worker restarts the reward
groups alone and the call is answered by the new ones."""

from __future__ import annotations

from rlvr.reward.routing import RoutedRewardWorker
from rlvr.trainer.recovery import Recovery, RestartableGroup
from rlvr.utils.errors import WorkerDiedError


class _FakeRewardGroups:
    """Stands for a RewardWorkerGroups: ``groups[name].compute_rewards``; the first generation dies."""

    started = 0

    def __init__(self) -> None:
        _FakeRewardGroups.started += 1
        self.generation = _FakeRewardGroups.started
        self.stopped = False
        self.groups = {"math_rule": self}

    def compute_rewards(self, data):
        if self.generation == 1:
            raise WorkerDiedError("reward_workers", "compute_rewards", 0, "process exited (SIGKILL)")
        return ("scored", data, self.generation)

    def shutdown(self) -> None:
        self.stopped = True


def test_a_dead_reward_worker_restarts_the_groups_and_the_call_is_sent_again():
    _FakeRewardGroups.started = 0
    recovery = Recovery(max_restarts=2)
    handle = RestartableGroup("reward workers", _FakeRewardGroups, None, recovery, lambda: 7)
    first = handle.group
    worker = RoutedRewardWorker(handle, "math_rule")
    assert worker.compute_rewards("batch") == ("scored", "batch", 2)
    assert first.stopped and not handle.group.stopped and handle.group.generation == 2
    assert [(r.failed_step, r.restored_step, r.cause) for r in recovery.restarts] == [(7, None, "worker died")]
    assert recovery.metrics()["trainer/restarts"] == 1
