"""Running tool calls with a time limit, all of a turn's calls at once.

Each call runs in its own daemon thread; the caller waits at most ``timeout_s`` for all of them
together (they start together). A call that is still running then is reported as timed out and
abandoned: its thread keeps running in the background until the tool returns, but nothing waits
for it and it cannot keep the process from exiting. A call that raises is reported as failed.
Either way the model gets an error message as the tool's output, and the rollout goes on.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["CallOutcome", "run_with_timeout"]


@dataclass
class CallOutcome:
    """The end of one call.

    Attributes:
        value: what the function returned (None unless ``status == "ok"``).
        status: ``ok``, ``error`` (it raised) or ``timeout`` (it did not return in time).
        error: the exception (``error``) or None.
        seconds: wall time of the call (the timeout for an abandoned call).
    """

    value: Any = None
    status: str = "timeout"
    error: BaseException | None = None
    seconds: float = 0.0


def run_with_timeout(functions: Sequence[Callable[[], Any]], timeout_s: float, name: str = "tool") -> list[CallOutcome]:
    """Call every function concurrently and collect the outcomes in order.

    Args:
        functions: zero-argument callables.
        timeout_s: how long to wait for all of them together, in seconds.
        name: thread name prefix (shows in thread dumps).

    Returns:
        One :class:`CallOutcome` per function, in the same order.
    """
    outcomes = [CallOutcome(seconds=float(timeout_s)) for _ in functions]
    threads = []
    for index, function in enumerate(functions):
        thread = threading.Thread(target=_run_into, args=(function, outcomes, index), name=f"{name}-{index}",
                                  daemon=True)
        thread.start()
        threads.append(thread)
    deadline = time.monotonic() + timeout_s
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    # an abandoned call may still write into its outcome later: hand back copies taken now
    return [CallOutcome(o.value, o.status, o.error, o.seconds) if not t.is_alive()
            else CallOutcome(seconds=float(timeout_s)) for o, t in zip(outcomes, threads)]


def _run_into(function: Callable[[], Any], outcomes: list[CallOutcome], index: int) -> None:
    start = time.monotonic()
    try:
        value = function()
    except Exception as err:  # noqa: BLE001 - a failing tool becomes an error message for the model
        outcomes[index] = CallOutcome(status="error", error=err, seconds=time.monotonic() - start)
        return
    outcomes[index] = CallOutcome(value=value, status="ok", seconds=time.monotonic() - start)
