"""Fail loud: worker exceptions, hangs, killed workers and broken constructors raise in the driver."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from sc_workers import BACKENDS, SEPARATE_PROCESS_BACKENDS, BrokenWorker, DemoWorker, late_part, world_size_of

from rlvr.protocol import DataProto
from rlvr.single_controller import ClassWithInitArgs
from rlvr.utils.errors import WorkerDiedError, WorkerError, WorkerTimeoutError


def test_worker_exception_names_group_method_rank_with_traceback(demo):
    backend, group = demo
    bad_rank = world_size_of(backend) - 1
    with pytest.raises(WorkerError) as info:
        group.fail_on(bad_rank)
    err = info.value
    assert type(err) is WorkerError
    assert (err.group, err.method, err.rank) == (f"demo_{backend}", "fail_on", bad_rank)
    message = str(err)
    assert f"worker group 'demo_{backend}', method 'fail_on', rank {bad_rank} failed" in message
    assert "deliberate failure on rank" in message
    assert 'sc_workers.py", line' in message  # the remote traceback
    assert group.add_rank(1) == [1, 2][: world_size_of(backend)]  # an exception does not break the group


@pytest.mark.slow
@pytest.mark.parametrize("backend", SEPARATE_PROCESS_BACKENDS)
def test_hanging_worker_times_out_and_the_group_refuses_further_calls(backend, make_group):
    group = make_group(backend, ClassWithInitArgs(DemoWorker), name_prefix="hanger", call_timeout_s=3)
    assert group.sleep(0.1) == [0, 1]
    start = time.monotonic()
    with pytest.raises(WorkerTimeoutError) as info:
        group.sleep(600)
    assert time.monotonic() - start < 6
    assert (info.value.group, info.value.method, info.value.rank) == ("hanger", "sleep", 0)
    assert "no result from rank(s) [0, 1] within 3.0 s" in str(info.value)
    with pytest.raises(WorkerTimeoutError, match="the group is unusable since method 'sleep' failed"):
        group.add_rank(1)


def test_local_timeout_is_checked_when_the_call_returns(make_group):
    group = make_group("local", ClassWithInitArgs(DemoWorker), name_prefix="slow_local", call_timeout_s=60)
    with pytest.raises(WorkerTimeoutError, match="cannot interrupt a call") as info:
        group.sleep(0.3, _timeout_s=0.1)  # per-call override of the group's 60 s
    assert (info.value.method, info.value.rank) == ("sleep", 0)
    assert group.sleep(0.0) == [0]  # the local worker is intact


@pytest.mark.parametrize("backend", SEPARATE_PROCESS_BACKENDS)
def test_killed_worker_raises_worker_died(backend, make_group):
    group = make_group(backend, ClassWithInitArgs(DemoWorker), name_prefix="victim", call_timeout_s=60)
    start = time.monotonic()
    with pytest.raises(WorkerDiedError) as info:
        group.exit_on(1)
    assert time.monotonic() - start < 30
    assert (info.value.group, info.value.method, info.value.rank) == ("victim", "exit_on", 1)
    with pytest.raises(WorkerDiedError, match="unusable"):
        group.add_rank(1)


@pytest.mark.slow
def test_a_child_that_dies_names_every_call_it_was_running(make_group):
    """Two calls in flight when the child dies: the error of each names both (a driver thread that
    awaits the other call, e.g. a weight push beside a generation, still learns what was running)."""
    group = make_group("process", ClassWithInitArgs(DemoWorker), name_prefix="busy", call_timeout_s=60,
                       max_concurrency=2)
    errors = []
    sleeper = threading.Thread(target=lambda: errors.append(pytest.raises(WorkerDiedError, group.sleep, 5.0)))
    sleeper.start()
    time.sleep(1.0)  # the sleep is running in both children
    with pytest.raises(WorkerDiedError) as info:
        group.exit_on(1)
    sleeper.join(timeout=30)
    assert str(info.value).endswith("the worker process died (exit code 1) while it ran exit_on, sleep")
    (slept,) = errors
    assert (slept.value.method, slept.value.rank) == ("sleep", 1)
    assert str(slept.value).endswith("while it ran exit_on, sleep")


@pytest.mark.parametrize("race", ["ended_before", "ends_during_the_send"])
def test_a_call_to_a_killed_child_says_how_it_ended_even_when_the_send_fails(make_group, monkeypatch, race):
    """A call submitted after the child was killed (or whose send hits the closed pipe) names the
    signal and what the child ran, not only the broken pipe (a weight push that follows a killed
    generation must still say SIGKILL)."""
    group = make_group("process", ClassWithInitArgs(DemoWorker), name_prefix="killed", call_timeout_s=60)
    child = group._workers[1]
    child.process.kill()
    if race == "ended_before":
        assert child.gone_event.wait(timeout=30)
    else:  # the send fails before the receiver has learned the exit code
        def broken_pipe(data: bytes) -> None:
            raise BrokenPipeError(32, "Broken pipe")

        monkeypatch.setattr(child.conn, "send_bytes", broken_pipe)
    with pytest.raises(WorkerDiedError) as info:
        group.add_rank(1)
    assert (info.value.method, info.value.rank) == ("add_rank", 1)
    message = str(info.value)
    assert "the worker process died (exit code -9, signal SIGKILL)" in message
    expected = "the call was not sent" if race == "ended_before" else "the call could not be sent ([Errno 32] Broken pipe)"
    assert message.endswith(expected)


@pytest.mark.parametrize("backend", BACKENDS)
def test_constructor_failure_raises_at_group_creation(backend, make_group):
    with pytest.raises(WorkerError, match="deliberate constructor failure") as info:
        make_group(backend, ClassWithInitArgs(BrokenWorker), name_prefix=f"broken_{backend}", call_timeout_s=60)
    last_rank = world_size_of(backend) - 1
    assert (info.value.group, info.value.method, info.value.rank) == (f"broken_{backend}", "__init__", last_rank)
    assert f"deliberate constructor failure on rank {last_rank}" in str(info.value)


@pytest.mark.ray
def test_data_proto_future_of_refs_times_out_and_reports_failures(ray_cluster):
    import ray

    from rlvr.protocol import DataProtoFuture

    task = ray.remote(num_cpus=0)(late_part)
    late = task.remote(30.0, False)
    slow = DataProtoFuture.concat([ray.put(DataProto.from_dict(tensors={"x": torch.ones(1)})), late])
    start = time.monotonic()
    with pytest.raises(WorkerTimeoutError, match=r"ObjectRef\(s\) \[1\] of 2 gave no result within 0.5 s") as info:
        slow.get(timeout_s=0.5)
    ray.cancel(late, force=True)
    assert time.monotonic() - start < 10 and (info.value.group, info.value.method, info.value.rank) == (
        "DataProtoFuture", "get", 1)
    with pytest.raises(WorkerError, match="deliberate failure of a part"):
        DataProtoFuture.concat([task.remote(0.0, True)]).get(timeout_s=60)
