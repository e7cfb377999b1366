"""A small process pool with a hard per-task time limit, for scorers that may hang or crash.

``concurrent.futures`` cannot kill one stuck worker, so this pool keeps one pipe per worker
process: a task that runs past its deadline gets its worker SIGKILLed (and replaced), a worker
that dies mid-task reports an error, and neither blocks the caller longer than the limit.
Workers start through ``forkserver`` (a clean interpreter, nothing inherited from a driver
that holds CUDA or Ray state), import the user's modules the parent imported
(:mod:`rlvr.utils.user_code`) and what the task function needs, and stay alive between calls
until :meth:`TimeoutProcessPool.close`.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Literal

from rlvr.utils.registrations import user_code_for_workers
from rlvr.utils.user_code import UserCode, import_user_code

_JOIN_TIMEOUT_S = 5.0


@dataclass
class TaskResult:
    """Outcome of one task: ``status`` ok (``value`` set), error or timeout (``error`` says why)."""

    status: Literal["ok", "error", "timeout"]
    value: Any = None
    error: str = ""


def _worker_loop(conn: Connection, initializer: Callable[[], Any] | None, user_code: UserCode) -> None:
    """Child process: import the user's code of the parent (its scorers register there), run
    ``initializer`` and report ready, then run ``(fn, args)`` tasks from the pipe until it closes
    or gets ``None``."""
    try:
        import_user_code(user_code)
        if initializer is not None:
            initializer()
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
        return
    conn.send(("ready", None))
    while True:
        try:
            task = pickle.loads(conn.recv_bytes())
        except EOFError:
            return
        if task is None:
            return
        fn, args = task
        try:
            conn.send(("ok", fn(*args)))
        except BaseException as exc:  # noqa: BLE001 - every failure is reported to the parent
            conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


class _Worker:
    """One child process and the parent's end of its pipe."""

    def __init__(self, ctx: Any, initializer: Callable[[], Any] | None) -> None:
        self.conn, child_conn = ctx.Pipe()
        self.process = ctx.Process(target=_worker_loop, args=(child_conn, initializer, user_code_for_workers()),
                                   daemon=True)
        self.process.start()
        child_conn.close()
        self.ready = False
        self.task_index: int | None = None
        self.deadline = 0.0

    def wait_ready(self, timeout_s: float) -> str | None:
        """Wait until the process has run its initializer; None when ready, else why not."""
        if self.ready:
            return None
        try:
            if not self.conn.poll(timeout_s):
                return f"the scoring process did not start within {timeout_s:g} s"
            status, payload = self.conn.recv()
        except (EOFError, OSError):
            return f"the scoring process died while starting (exit code {self.process.exitcode})"
        if status != "ready":
            return f"the scoring process failed to start: {payload}"
        self.ready = True
        return None

    def kill(self) -> None:
        self.process.kill()
        self.process.join(_JOIN_TIMEOUT_S)
        self.conn.close()

    def stop(self) -> None:
        try:
            self.conn.send_bytes(pickle.dumps(None))
        except (BrokenPipeError, OSError):
            pass
        self.process.join(_JOIN_TIMEOUT_S)
        if self.process.is_alive():
            self.kill()
        else:
            self.conn.close()


class TimeoutProcessPool:
    """Run picklable tasks in ``num_workers`` processes, each task bounded by ``timeout_s``.

    Args:
        num_workers: worker processes (started lazily on the first :meth:`run`).
        timeout_s: wall-clock limit of one task; a task over it is killed with its worker.
        start_method: multiprocessing start method (``forkserver`` or ``spawn``).
        initializer: run once in every new worker process before its first task (e.g. heavy
            imports), so that the start-up does not count against a task's limit.
        start_timeout_s: how long a new worker may take to start and run ``initializer``.
    """

    def __init__(self, num_workers: int, timeout_s: float, start_method: str = "forkserver",
                 initializer: Callable[[], Any] | None = None, start_timeout_s: float = 120.0) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.num_workers, self.timeout_s = num_workers, timeout_s
        self.initializer, self.start_timeout_s = initializer, start_timeout_s
        self._ctx = mp.get_context(start_method)
        self._workers: list[_Worker] = []

    def run(self, fn: Callable[..., Any], args_list: Sequence[tuple]) -> list[TaskResult]:
        """Run ``fn(*args)`` for every ``args`` in ``args_list``; results in input order."""
        results: list[TaskResult | None] = [None] * len(args_list)
        pending = deque(range(len(args_list)))
        while len(self._workers) < min(self.num_workers, len(args_list)):
            self._workers.append(_Worker(self._ctx, self.initializer))
        while pending or any(w.task_index is not None for w in self._workers):
            for worker in list(self._workers):
                if worker.task_index is None and pending:
                    index = pending.popleft()
                    results[index] = self._submit(worker, index, fn, args_list[index])
            if not any(w.task_index is not None for w in self._workers):
                continue
            busy = [w for w in self._workers if w.task_index is not None]
            next_deadline = min(w.deadline for w in busy)
            ready = wait([w.conn for w in busy], timeout=max(0.0, next_deadline - time.monotonic()))
            for worker in busy:
                index = worker.task_index
                if worker.conn in ready:
                    results[index] = self._receive(worker)
                elif time.monotonic() >= worker.deadline:
                    results[index] = TaskResult(
                        "timeout", error=f"still running after the {self.timeout_s:g} s limit; worker process killed"
                    )
                    self._replace(worker)
        return [r for r in results if r is not None]

    def _submit(self, worker: _Worker, index: int, fn: Callable[..., Any], args: tuple) -> TaskResult | None:
        """Send a task to an idle worker (replacing it first if it died while idle); returns an
        error result when the task cannot be pickled, else None (the result comes later)."""
        if not worker.process.is_alive():
            worker = self._replace(worker)
        not_started = worker.wait_ready(self.start_timeout_s)
        if not_started is not None:
            self._replace(worker)
            return TaskResult("error", error=not_started)
        try:
            payload = pickle.dumps((fn, args))
        except Exception as exc:  # noqa: BLE001 - reported as this task's error
            return TaskResult("error", error=f"task could not be pickled for the scoring process: {exc!r}")
        worker.task_index, worker.deadline = index, time.monotonic() + self.timeout_s
        worker.conn.send_bytes(payload)
        return None

    def _receive(self, worker: _Worker) -> TaskResult:
        try:
            status, payload = worker.conn.recv()
        except (EOFError, OSError):
            worker.process.join(_JOIN_TIMEOUT_S)
            code = worker.process.exitcode
            self._replace(worker)
            return TaskResult("error", error=f"scoring process died (exit code {code})")
        worker.task_index = None
        return TaskResult("ok", value=payload) if status == "ok" else TaskResult("error", error=payload)

    def _replace(self, worker: _Worker) -> _Worker:
        """Kill ``worker`` and put a fresh process in its slot."""
        worker.kill()
        fresh = _Worker(self._ctx, self.initializer)
        self._workers[self._workers.index(worker)] = fresh
        return fresh

    def close(self) -> None:
        """Stop every worker process (idempotent)."""
        for worker in self._workers:
            worker.stop()
        self._workers = []

    def __enter__(self) -> TimeoutProcessPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
