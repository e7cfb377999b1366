"""Fault injection for the recovery tests and the reliability benchmark.

``with_faults(ActorRolloutRefWorker, [Fault("update_actor", rank=1, call=2, kind="kill", marker=...)])``
is a subclass of the worker whose rank 1 kills its own process with SIGKILL (what the kernel's OOM
killer sends) when ``update_actor`` is called for the second time in that process. A fault fires
once per run: it creates its ``marker`` file first and never fires while the file exists, so the
workers started by a restart run normally; ``after`` chains a fault to another one (a worker that
dies again while the restart starts it).

Kinds: ``kill`` (SIGKILL), ``segfault`` (a real invalid memory read), ``hang`` (sleep for an hour:
the call outlives its timeout).
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlvr.single_controller.base.decorator import REGISTER_ATTR, RegisterSpec, registered_methods

FAULT_KINDS = ("kill", "segfault", "hang")


@dataclass(frozen=True)
class Fault:
    """One fault.

    Attributes:
        method: the registered worker method it fires in (before the method's work).
        rank: the rank that fails.
        call: fire at this call of ``method`` in the worker process (1 = the first).
        kind: ``kill``, ``segfault`` or ``hang``.
        marker: a file path; the fault fires only if it does not exist, and creates it.
        after: another fault's marker: fire only once that fault has fired (chained faults).
    """

    method: str
    rank: int
    call: int
    kind: str
    marker: str
    after: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; use one of {', '.join(FAULT_KINDS)}")


def _claim(marker: str) -> bool:
    """Create ``marker``; False when it exists already (the fault fired before)."""
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.write(fd, f"{time.time()}\n".encode())
    os.close(fd)
    return True


def _fire(kind: str) -> None:
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == "segfault":
        ctypes.string_at(0)
    else:
        time.sleep(3600)


def _faulty(name: str, original: Callable[..., Any], spec: RegisterSpec, faults: list[Fault]) -> Callable[..., Any]:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls = self.__dict__.setdefault("_fault_calls", {})
        calls[name] = calls.get(name, 0) + 1
        for fault in faults:
            ready = fault.after is None or os.path.exists(fault.after)
            if fault.rank == self.rank and fault.call == calls[name] and ready and _claim(fault.marker):
                _fire(fault.kind)
        return original(self, *args, **kwargs)

    method.__name__ = name
    setattr(method, REGISTER_ATTR, spec)  # dispatched like the original
    return method


def with_faults(worker_cls: type, faults: Sequence[Fault]) -> type:
    """A subclass of ``worker_cls`` that fires ``faults`` (see the module docstring)."""
    for fault in faults:
        Path(fault.marker).parent.mkdir(parents=True, exist_ok=True)
    registered = registered_methods(worker_cls)
    attrs = {}
    for name in sorted({fault.method for fault in faults}):
        if name not in registered:
            raise ValueError(f"{worker_cls.__name__}.{name} is not a registered worker method; faults fire in "
                             "methods that the driver calls through a worker group")
        attrs[name] = _faulty(name, getattr(worker_cls, name), registered[name], [f for f in faults if f.method == name])
    return type(f"Faulty{worker_cls.__name__}", (worker_cls,), attrs)
