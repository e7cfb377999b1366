"""Automatic recovery from dead or hung workers (Ray backend).

A worker that dies (killed, OOM-killed, segfault) or a call that outlives its timeout makes its
worker group unusable. The trainer then

1. tears down every worker group (``ray.kill`` also ends hung processes) and gives the placement
   groups back,
2. starts the groups again and loads the models,
3. restores the last whole checkpoint that this run wrote or resumed from (the run's start when
   there is none), the driver state included (data position, RNG states, KL controller),
4. goes on from that step, so the steps after the restart give the metrics that a run resumed
   from the same checkpoint gives.

It does so up to ``trainer.max_restarts`` times; the next failure ends the run with
:class:`RestartLimitError`, whose cause is an ``ExceptionGroup`` of every failure (each with its
traceback). A *stateless* group (reward workers, an LLM judge: no training state) is restarted
alone by :class:`RestartableGroup` and the failed call is sent to the new group; training does
not roll back. Every restart is logged with its cause, counted in the step metrics
(``trainer/restarts``) and listed in the report.

On the local backend the workers live in the driver; a crash there ends the process, and a
graceful stop plus a resume (``trainer.resume_mode=auto``) covers it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from rlvr.single_controller.base.decorator import registered_methods
from rlvr.single_controller.base.worker_group import WorkerGroup
from rlvr.utils.errors import RlvrError, WorkerDiedError, WorkerError, WorkerTimeoutError

logger = logging.getLogger(__name__)

RECOVERABLE_ERRORS = (WorkerDiedError, WorkerTimeoutError)
"""Failures that a restart cures; an exception raised by worker code (a bug, bad data) is not one."""


@dataclass
class Restart:
    """One recovery, as logged and reported.

    Attributes:
        failed_step: the training step that was running when the worker failed.
        group, method, rank: where it failed.
        cause: ``"worker died"`` or ``"call timed out"``.
        restored_step: the checkpoint step training went back to (0: the run's start); None when a
            stateless group was restarted alone (nothing rolled back).
        seconds: wall time from the failure to the workers being ready again.
    """

    failed_step: int
    group: str
    method: str
    rank: int
    cause: str
    restored_step: int | None
    seconds: float

    @property
    def steps_redone(self) -> int:
        """Steps trained again because of the restart, the interrupted one included."""
        return 0 if self.restored_step is None else self.failed_step - self.restored_step


def _cause(error: WorkerError) -> str:
    return "call timed out" if isinstance(error, WorkerTimeoutError) else "worker died"


class RestartLimitError(RlvrError):
    """More worker failures than ``trainer.max_restarts`` allows; lists every one of them."""

    def __init__(self, failures: list[tuple[int, WorkerError]], max_restarts: int) -> None:
        self.failures = failures
        lines = [f"  {i}. step {step}: {_cause(err)} in worker group '{err.group}', method '{err.method}', "
                 f"rank {err.rank}" for i, (step, err) in enumerate(failures, start=1)]
        super().__init__(f"training stopped after {len(failures)} worker failures; trainer.max_restarts="
                         f"{max_restarts} allows {max_restarts} restart(s):\n" + "\n".join(lines) +
                         "\nEvery failure with its traceback is in the cause below. Fix what kills or stalls "
                         "the workers (memory, a hung collective), raise trainer.call_timeout_s, or raise "
                         "trainer.max_restarts.")


class Recovery:
    """The restart budget of a run and the log of its restarts.

    Args:
        max_restarts: restarts allowed over the whole run (stateless and full ones together).
    """

    def __init__(self, max_restarts: int) -> None:
        self.max_restarts = max_restarts
        self.failures: list[tuple[int, WorkerError]] = []
        self.restarts: list[Restart] = []

    def admit(self, error: WorkerError, step: int) -> float:
        """Count the failure; raise :class:`RestartLimitError` (from every failure) past the budget.
        Returns the start time of the recovery (``time.monotonic()``)."""
        self.failures.append((step, error))
        if len(self.failures) > self.max_restarts:
            raise RestartLimitError(self.failures, self.max_restarts) from ExceptionGroup(
                "every worker failure of the run", [err for _, err in self.failures])
        first_line = (error.detail.strip().splitlines() or [""])[0][:300]
        logger.warning("restart %d of at most %d: %s in worker group '%s', method '%s', rank %d at step %d (%s); "
                       "restarting the workers", len(self.failures), self.max_restarts, _cause(error), error.group,
                       error.method, error.rank, step, first_line)
        return time.monotonic()

    def record(self, error: WorkerError, step: int, restored_step: int | None, started: float) -> Restart:
        """Log a finished recovery and keep it for the metrics and the report."""
        restart = Restart(failed_step=step, group=error.group, method=error.method, rank=error.rank,
                          cause=_cause(error), restored_step=restored_step, seconds=time.monotonic() - started)
        self.restarts.append(restart)
        where = ("the group alone, no rollback" if restored_step is None
                 else f"back to step {restored_step}, {restart.steps_redone} step(s) to redo")
        logger.warning("recovered from the failure at step %d in %.1f s (%s)", step, restart.seconds, where)
        return restart

    def metrics(self) -> dict[str, float]:
        """``trainer/restarts``: worker-group restarts so far in this run (one per failure admitted,
        a failure while restarting included)."""
        return {"trainer/restarts": float(len(self.failures))}

    def report_rows(self) -> list[dict[str, Any]]:
        """One dict per restart (the fields of :class:`Restart` plus ``steps_redone``)."""
        return [{**asdict(r), "steps_redone": r.steps_redone} for r in self.restarts]


class RestartableGroup:
    """Handle of a stateless worker group (reward workers, an LLM judge) that restarts alone.

    Each ``@register``-ed method of ``worker_cls`` is a method of the handle (and :meth:`run` sends
    any call); when the call fails because a worker died or hung, the group is shut down, created
    again with ``create`` and the call is sent again (its workers hold no state, so the call gives
    the same result). Calls may come from several threads (the asynchronous rollout's and the
    trainer's): the first to see a failure restarts the group, the others send their call to the
    new group. After :meth:`shutdown` (until :meth:`rebuild`) a failure is raised, not restarted
    from: the trainer is tearing the workers down.

    Args:
        name: the group's name in logs and the report.
        create: starts the group and loads what its workers need; called again for every restart.
            What it returns needs a ``shutdown()`` method.
        worker_cls: the class of the group's workers (``None``: calls go through :meth:`run` only).
        recovery: the trainer's restart budget and log.
        current_step: the training step, for the log.
    """

    def __init__(self, name: str, create: Callable[[], Any], worker_cls: type | None, recovery: Recovery,
                 current_step: Callable[[], int]) -> None:
        self.name = name
        self._create = create
        self._recovery = recovery
        self._current_step = current_step
        self._lock = threading.Lock()
        self._closed = False
        self.group = create()
        for method in registered_methods(worker_cls) if worker_cls is not None else ():
            setattr(self, method, self._retrying(method))

    def run(self, call: Callable[[Any], Any]) -> Any:
        """``call(group)``, sent again on a new group after each recoverable failure."""
        while True:
            group = self.group
            try:
                return call(group)
            except WorkerError as err:
                with self._lock:  # waits for a restart that another thread has begun
                    if self.group is not group:
                        continue  # the group was restarted meanwhile (maybe because of this very failure)
                    if self._closed or not isinstance(err, RECOVERABLE_ERRORS):
                        raise
                    step = self._current_step()
                    started = self._recovery.admit(err, step)
                    self._replace()
                    self._recovery.record(err, step, restored_step=None, started=started)

    def _retrying(self, method: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            return self.run(lambda group: getattr(group, method)(*args, **kwargs))

        call.__name__ = method
        return call

    def rebuild(self) -> None:
        """Shut the group down (killing hung workers) and start it again."""
        with self._lock:
            self._replace()
            self._closed = False

    def _replace(self) -> None:
        self.group.shutdown()
        self.group = self._create()

    def shutdown(self) -> None:
        """Shut the group down; calls that fail from now on raise until :meth:`rebuild`."""
        with self._lock:
            self._closed = True
            self.group.shutdown()
