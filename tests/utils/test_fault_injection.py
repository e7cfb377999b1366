"""The fault-injection wrapper: fires once per marker, on the chosen rank and call, chained by ``after``."""

from __future__ import annotations

import pytest

from rlvr.single_controller import Dispatch, Worker, register
from rlvr.single_controller.base.decorator import registered_methods
from rlvr.utils import fault_injection
from rlvr.utils.fault_injection import Fault, with_faults


class Echo(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def echo(self, x: int) -> int:
        return x

    def helper(self) -> None:
        """Not registered."""


@pytest.fixture
def fired(monkeypatch) -> list[str]:
    kinds: list[str] = []
    monkeypatch.setattr(fault_injection, "_fire", kinds.append)
    return kinds


def test_a_fault_fires_once_at_its_call_on_its_rank(tmp_path, fired):
    marker = tmp_path / "m"
    faulty = with_faults(Echo, [Fault("echo", rank=0, call=2, kind="kill", marker=str(marker))])
    assert registered_methods(faulty)["echo"] == registered_methods(Echo)["echo"]  # dispatched as before
    worker = faulty()
    assert [worker.echo(i) for i in range(3)] == [0, 1, 2]
    assert fired == ["kill"] and marker.exists()
    again = faulty()  # a restarted worker: the marker keeps the fault from firing twice
    assert [again.echo(i) for i in range(3)] == [0, 1, 2] and fired == ["kill"]


def test_other_ranks_and_chained_faults(tmp_path, fired, monkeypatch):
    first, second = tmp_path / "first", tmp_path / "second"
    faults = [Fault("echo", rank=1, call=1, kind="hang", marker=str(first)),
              Fault("echo", rank=0, call=1, kind="segfault", marker=str(second), after=str(first))]
    faulty = with_faults(Echo, faults)
    faulty().echo(0)  # rank 0: the chained fault waits for the first one
    assert fired == []
    monkeypatch.setenv("RANK", "1")
    faulty().echo(0)
    monkeypatch.setenv("RANK", "0")
    faulty().echo(0)
    assert fired == ["hang", "segfault"]


def test_bad_faults_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="Echo.helper is not a registered worker method"):
        with_faults(Echo, [Fault("helper", rank=0, call=1, kind="kill", marker=str(tmp_path / "m"))])
    with pytest.raises(ValueError, match="unknown fault kind 'oom'; use one of kill, segfault, hang"):
        Fault("echo", rank=0, call=1, kind="oom", marker=str(tmp_path / "m"))
