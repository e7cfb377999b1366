"""The sample buffer: the admission rule (hand-computed cases and a simulated run that checks the
bound from per-token versions), dropping, and waits that end with an error naming the stage."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from rlvr.protocol import DataProto
from rlvr.trainer.async_schedule.buffer import SampleBuffer
from rlvr.trainer.async_schedule.versions import sample_staleness
from rlvr.utils.errors import WorkerTimeoutError

B = 2


def group(uid: str, version: int, n: int = 2) -> DataProto:
    """A prompt group of ``n`` samples, every token generated with weights ``version``."""
    versions = torch.full((n, 3), version)
    return DataProto.from_dict(tensors={"response_versions": versions, "response_mask": torch.ones(n, 3)},
                               non_tensors={"uid": [uid] * n})


@pytest.mark.parametrize(("bound", "version", "pushed", "ahead", "waiting", "admitted"), [
    (0, 0, 0, 0, True, True),    # sync: the trainer waits for this batch, newest weights
    (0, 0, 0, 0, False, False),  # sync: the trainer is training (an update may come)
    (1, 3, 3, 0, False, True),   # one step: generate while the trainer trains on the last batch
    (1, 3, 3, 2, False, False),  # one step: a batch is ahead already
    (1, 3, 3, 2, True, True),    # ... but the trainer is waiting (for that batch)
    (2, 4, 3, 2, True, True),    # the weights lag one version (a push every 2 updates)
    (2, 4, 3, 2, False, False),
    (3, 0, 0, 4, False, True),
])
def test_wait_admits_a_batch_only_when_no_sample_can_exceed_the_bound(bound, version, pushed, ahead, waiting,
                                                                       admitted):
    buffer = SampleBuffer(B, bound, drop=False, rollout_name="rollout")
    buffer.version, buffer.pushed, buffer.in_flight, buffer.trainer_waiting = version, pushed, ahead, waiting
    assert buffer.admitted() is admitted


def test_drop_keeps_at_most_bound_plus_one_batches_and_never_starves_a_waiting_trainer():
    buffer = SampleBuffer(B, 1, drop=True, rollout_name="rollout")
    buffer.in_flight = 2 * B
    assert not buffer.admitted()
    buffer.in_flight = B
    assert buffer.admitted()
    drop0 = SampleBuffer(B, 0, drop=True, rollout_name="rollout")
    drop0.in_flight = 1  # a dropped group left the buffer short
    assert not drop0.admitted()
    drop0.trainer_waiting = True
    assert drop0.admitted()


def test_take_drops_groups_over_the_bound_and_requeues_their_prompts():
    buffer = SampleBuffer(B, 1, drop=True, rollout_name="rollout")
    buffer.version = 5
    buffer.put([group("a", 3), group("b", 4), group("c", 5)])  # a is 2 versions old
    requeued = []
    taken, dropped = buffer.take(5.0, requeued.extend)
    assert [g.non_tensor_batch["uid"][0] for g in taken] == ["b", "c"] and dropped == 1 and requeued == ["a"]
    assert buffer.take_counters()["async/dropped_samples"] == 2.0  # one group of 2 samples


def test_a_simulated_asynchronous_run_never_trains_a_sample_over_the_bound():
    """The rollout (a thread) generates with the last pushed weights as soon as it is admitted; the
    trainer takes, "trains" and pushes, at random speeds. Every taken sample is within the bound."""
    for bound in (0, 1, 3):
        buffer = SampleBuffer(B, bound, drop=False, rollout_name="rollout")
        rng = torch.Generator().manual_seed(bound)
        stop = threading.Event()

        def rollout():
            uid = 0
            while buffer.wait_for_admission() and not stop.is_set():
                version = buffer.pushed
                time.sleep(float(torch.rand(1, generator=rng)) * 0.01)
                buffer.put([group(f"{uid}-{i}", version) for i in range(B)])
                uid += 1

        thread = threading.Thread(target=rollout, daemon=True)
        thread.start()
        worst = 0
        for step in range(30):
            taken, _ = buffer.take(10.0, lambda uids: None)
            for g in taken:
                staleness = sample_staleness(g.batch["response_versions"], g.batch["response_mask"], buffer.version)
                worst = max(worst, int(staleness.max()))
            time.sleep(float(torch.rand(1, generator=rng)) * 0.01)
            buffer.updated(pushed=True)
        stop.set()
        buffer.stop()
        thread.join(timeout=5)
        assert worst == bound  # reached, never exceeded


def test_a_trainer_waiting_too_long_gets_an_error_naming_the_stage_and_the_rollout_group():
    buffer = SampleBuffer(B, 1, drop=False, rollout_name="rollout_ab12")
    buffer.in_flight = B
    start = time.monotonic()
    with pytest.raises(WorkerTimeoutError, match="waited 0 s for generated samples") as info:
        buffer.take(0.3, lambda uids: None)
    assert time.monotonic() - start < 2
    assert (info.value.group, info.value.method) == ("rollout_ab12", "generate_sequences")
    assert "stage 'gen' of an asynchronous run" in str(info.value) and "queue_timeout_s" in str(info.value)


def test_a_rollout_failure_reaches_the_waiting_trainer():
    buffer = SampleBuffer(B, 1, drop=False, rollout_name="rollout")
    threading.Timer(0.2, buffer.fail, args=(RuntimeError("the rollout broke"),)).start()
    with pytest.raises(RuntimeError, match="the rollout broke"):
        buffer.take(10.0, lambda uids: None)
