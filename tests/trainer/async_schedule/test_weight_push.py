"""The weight push in the background: it returns before the rollout confirmed, the next push waits
for that confirmation before it writes the buffer again, a push that hangs or fails is raised with
the stage and worker named, and the way the weights travel is chosen (and logged) once."""

from __future__ import annotations

import logging
import threading
import time

import pytest
import torch

from rlvr.trainer.async_schedule import weight_push
from rlvr.trainer.async_schedule.schedule import AsyncRollout
from rlvr.trainer.async_schedule.weight_push import BackgroundPush, WeightPacker
from rlvr.trainer.config.loader import load_config
from rlvr.utils.errors import WorkerError, WorkerTimeoutError
from rlvr.workers.rollout.shared_weights import SharedWeights

ONE_STEP = ["actor_rollout_ref.hybrid_engine=false", "async_training.mode=one_step", "trainer.backend=local",
            "trainer.device=cpu", "async_training.weight_sync_timeout_s=20"]


class _Group:
    """A rollout group whose ``update_weights`` reads the handle once the test releases the call."""

    def __init__(self) -> None:
        self.release: dict[int, threading.Event] = {}
        self.read: dict[int, torch.Tensor] = {}
        self.timeouts: list[float] = []

    def update_weights(self, handle, version: int, _timeout_s: float) -> None:
        self.timeouts.append(_timeout_s)
        self.release.setdefault(version, threading.Event()).wait(20)
        with handle.tensors() as views:
            self.read[version] = views["w"].clone()


def _rollout(actor: dict[str, torch.Tensor], group: _Group, asked: list[bool]) -> AsyncRollout:
    def actor_weights(on_device: bool) -> dict[str, torch.Tensor]:
        asked.append(on_device)
        return {name: t.clone() for name, t in actor.items()}

    cfg = load_config("grpo", ONE_STEP)
    return AsyncRollout(cfg, iter([]), lambda batch: batch, lambda: group, actor_weights, "rollout")


def test_a_push_returns_before_the_reply_and_the_next_waits_for_it_before_writing_the_segment():
    actor, group, asked = {"w": torch.full((1000,), 1.0)}, _Group(), []
    rollout = _rollout(actor, group, asked)
    try:
        start = time.perf_counter()
        rollout.push_weights(1)
        assert time.perf_counter() - start < 5 and 1 not in group.read  # returned; the rollout has not read yet
        assert isinstance(rollout._weights[0], SharedWeights) and asked == [False]  # a CPU run: host weights
        actor["w"].fill_(2.0)
        second = threading.Thread(target=rollout.push_weights, args=(2,))
        second.start()
        time.sleep(0.5)
        assert second.is_alive()  # waiting for push 1's reply: the segment still holds version 1
        group.release.setdefault(1, threading.Event()).set()
        second.join(10)
        assert not second.is_alive() and torch.equal(group.read[1], torch.full((1000,), 1.0))
        assert rollout.last_push_s >= 0.4  # the trainer blocked on the previous push's confirmation
        group.release.setdefault(2, threading.Event()).set()
        rollout.sync_weights()  # a validation waits for the push in flight
        assert torch.equal(group.read[2], torch.full((1000,), 2.0))
        assert rollout._push.last_confirm_s > 0 and group.timeouts == [20.0, 20.0]
    finally:
        for event in group.release.values():
            event.set()
        rollout.close()


def test_a_push_that_gets_no_reply_raises_a_timeout_naming_the_stage_and_worker(monkeypatch):
    monkeypatch.setattr(weight_push, "WAIT_MARGIN_S", 0.0)
    push, hang = BackgroundPush(0.2, "rollout_ab12"), threading.Event()
    push.start(lambda: hang.wait(10), version=3, started=time.perf_counter())
    with pytest.raises(WorkerTimeoutError) as caught:
        push.wait("a validation")
    message = str(caught.value)
    assert "worker group 'rollout_ab12', method 'update_weights', rank 0" in message
    assert "version 3 was not confirmed within 0.2 s" in message and "before a validation" in message
    hang.set()
    assert push.discard(5) and not push.in_flight


def test_a_failed_push_is_raised_by_every_wait_until_discarded_and_blocks_the_next_push():
    push = BackgroundPush(5.0, "rollout")
    failure = WorkerError("rollout", "update_weights", 0, "the engine refused the weights")

    def send():
        raise failure

    push.start(send, version=1, started=time.perf_counter())
    for stage in ("the next weight push", "a generation"):
        with pytest.raises(WorkerError, match="the engine refused"):
            push.wait(stage)
    with pytest.raises(RuntimeError, match="before the previous one was waited for"):
        push.start(lambda: None, version=2, started=time.perf_counter())
    assert push.discard(1)
    push.wait("a checkpoint")  # nothing in flight, nothing failed
    started = time.perf_counter()
    push.start(lambda: time.sleep(0.2), version=2, started=started)
    push.wait("the end of the run")
    assert 0.2 <= push.last_confirm_s < 5


def test_the_path_is_chosen_per_push_and_logged_once(caplog):
    packer = WeightPacker(on_ray=False, rollout_device="cuda:0")
    assert packer.wants_device_weights  # a GPU rollout child: the actor hands over device tensors
    assert not WeightPacker(on_ray=False, rollout_device="cpu").wants_device_weights
    assert not WeightPacker(on_ray=True, rollout_device="cuda:0").wants_device_weights
    try:
        with caplog.at_level(logging.INFO, logger=weight_push.__name__):
            first = packer.pack({"w": torch.ones(3)})  # CPU weights (e.g. a Megatron actor): shared memory
            second = packer.pack({"w": torch.zeros(3)})
        assert isinstance(first, SharedWeights) and second == first
        lines = [r.getMessage() for r in caplog.records if "async weight push" in r.getMessage()]
        assert len(lines) == 1 and lines[0].startswith("async weight push: shared memory (")
    finally:
        packer.close()
