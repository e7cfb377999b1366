"""Server replicas: the ones rlvr starts as subprocesses (managed) and the ones a user runs (external).

A managed replica is one server process with its own port, environment (thread binding, devices),
and log file; it is started in its own process group so that stopping it also stops the engine
processes it spawns. Readiness is its health route answering 200; a process that exits while
starting fails at once with the end of its log.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rlvr.workers.rollout.server.http import Endpoint, ReplicaError, ReplicaUnavailable, call_json

__all__ = ["ManagedReplica", "ExternalReplica", "log_tail"]

PR_SET_PDEATHSIG = 1
STOP_GRACE_S = 20.0
"""Seconds a replica gets to exit after SIGTERM before it is killed."""


def _stop_with_parent() -> None:
    """In the child before ``exec``: ask Linux to send SIGTERM when the thread that started it exits
    (the engine's supervisor thread, which lives as long as the engine: a trainer killed with SIGKILL
    leaves no replica behind). Elsewhere nothing is done."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def log_tail(path: Path, lines: int = 25) -> str:
    """The last ``lines`` lines of a log file (empty if it does not exist)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""


class ExternalReplica:
    """A server the user runs; rlvr only talks to it.

    Args:
        index: position in ``rollout.server.urls``.
        url: ``http://host:port``.
        api_key: sent with every call.
        health_path: the server's health route.
    """

    managed = False

    def __init__(self, index: int, url: str, api_key: str | None, health_path: str) -> None:
        self.index = index
        self.endpoint = Endpoint(f"replica {index} ({url})", url.rstrip("/"), api_key)
        self.health_path = health_path

    def healthy(self, timeout_s: float = 5.0) -> bool:
        try:
            call_json(self.endpoint, "GET", self.health_path, None, timeout_s, "health")
        except ReplicaError:
            return False
        return True

    def exited(self) -> bool:
        """An external server is never known to have exited (it may come back)."""
        return False

    def start(self) -> None:
        return None

    def wait_ready(self, timeout_s: float) -> float:
        """Seconds until the health route answered.

        Raises:
            ReplicaUnavailable: it did not within ``timeout_s``.
        """
        start = time.perf_counter()
        while not self.healthy():
            if time.perf_counter() - start > timeout_s:
                raise ReplicaUnavailable(self.endpoint.name, "health", f"no healthy answer within {timeout_s:g} s; "
                                         "is the server running and rollout.server.urls right?")
            time.sleep(1.0)
        return time.perf_counter() - start

    def stop(self) -> None:
        return None


class ManagedReplica(ExternalReplica):
    """A server subprocess that rlvr starts, restarts and stops.

    Args:
        index: replica number.
        host, port: where it listens.
        api_key: the key it requires (and rlvr sends).
        command: its command line.
        env: its whole environment.
        log_path: its stdout and stderr go here (appended across restarts).
        health_path: the server's health route.
    """

    managed = True

    def __init__(self, index: int, host: str, port: int, api_key: str | None, command: list[str],
                 env: dict[str, str], log_path: Path, health_path: str) -> None:
        super().__init__(index, f"http://{host}:{port}", api_key, health_path)
        self.command, self.env, self.log_path = command, env, log_path
        self.process: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        """Start the process (returns at once; see :meth:`wait_ready`)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"\n==== rlvr: start {self.starts + 1}: {' '.join(self.command)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(self.command, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True,
                                            preexec_fn=_stop_with_parent)
        self.starts += 1

    def exited(self) -> bool:
        return self.process is None or self.process.poll() is not None

    def wait_ready(self, timeout_s: float) -> float:
        """Seconds from now until the health route answered.

        Raises:
            ReplicaUnavailable: the process exited, or no healthy answer within ``timeout_s`` (the
                message has the end of its log).
        """
        start = time.perf_counter()
        while not self.healthy(timeout_s=2.0):
            if self.exited():
                code = None if self.process is None else self.process.returncode
                raise ReplicaUnavailable(self.endpoint.name, "start", f"the server process exited with code {code} "
                                         f"before it was ready; its log {self.log_path} ends with:\n"
                                         f"{log_tail(self.log_path)}")
            if time.perf_counter() - start > timeout_s:
                self.stop()
                raise ReplicaUnavailable(self.endpoint.name, "start", f"not ready within {timeout_s:g} s "
                                         f"(rollout.server.startup_timeout_s); its log {self.log_path} ends with:\n"
                                         f"{log_tail(self.log_path)}")
            time.sleep(1.0)
        return time.perf_counter() - start

    def stop(self) -> None:
        """SIGTERM to its process group, SIGKILL after :data:`STOP_GRACE_S`; waits for the exit."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, STOP_GRACE_S)):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                return
            try:
                process.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue
