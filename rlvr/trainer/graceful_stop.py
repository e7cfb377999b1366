"""Graceful stop on SIGINT / SIGTERM (Ctrl-C, ``kill``, a cluster scheduler's preemption notice).

The first signal asks the training loop to stop after the step it is in: the loop finishes that
step, writes a checkpoint and returns, and the ``rlvr`` command prints where the checkpoint is and
the command that resumes. A second signal stops at once by raising :class:`StopNow`; checkpoints
are whole or absent (see :mod:`rlvr.trainer.checkpoint`), so stopping in the middle of a save
leaves the previous checkpoint as the one a resume takes.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType, TracebackType
from typing import Any

logger = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopNow(KeyboardInterrupt):
    """Raised by a second stop signal: leave at once (a ``KeyboardInterrupt``, so that no
    ``except Exception`` on the way catches it).

    Args:
        signum: the signal received.
    """

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"{signal.Signals(signum).name} received twice: stopping at once")


class GracefulStop:
    """Context manager that turns the first SIGINT/SIGTERM into a stop request.

    Inside the ``with`` block, :attr:`signum` is None until a stop signal arrives, then the signal's
    number; the previous handlers come back on exit. Outside the main thread (where Python cannot
    receive signals) it installs nothing and never requests a stop.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        """Whether a stop signal has arrived."""
        return self.signum is not None

    @property
    def signal_name(self) -> str:
        """``"SIGTERM"`` etc. of the signal received (only when :attr:`requested`)."""
        return signal.Signals(self.signum).name

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:
            raise StopNow(signum)
        self.signum = signum
        logger.warning("%s received: the current step finishes, then a checkpoint is written and training "
                       "stops (send the signal again to stop at once, without a new checkpoint)",
                       signal.Signals(signum).name)

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handle) for sig in STOP_SIGNALS}
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
