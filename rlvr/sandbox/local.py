"""Local code sandbox: run untrusted Python in an isolated, resource-limited subprocess.

Isolation layers (see ``_runner.py`` for the order in which they are applied):

* **network** — a new network namespace (no interfaces); fallback: ``socket.socket`` replaced by a
  refusing class before user code runs (weaker: native code or ``ctypes`` can bypass it);
* **file system** — the program runs as an unprivileged uid (one per concurrent run) in a fresh
  directory that is deleted afterwards; in a mount namespace ``/tmp``, ``/var/tmp`` and ``/dev/shm``
  are throw-away tmpfs mounts, so writes outside the directory either fail (permission denied) or
  vanish with the run; fallback: the uid alone (the program can then write to world-writable
  host directories such as ``/tmp``);
* **processes** — ``RLIMIT_NPROC`` for the sandbox uid, a PID namespace whose processes the kernel
  kills when the program ends, and a new session whose process group is killed on timeout;
  fallback: ``kill(-1)`` as the sandbox uid;
* **resources** — ``RLIMIT_CPU``, ``RLIMIT_AS``, ``RLIMIT_FSIZE`` (stdout/stderr go to files, so a
  program printing forever is stopped by it), ``RLIMIT_NOFILE``, wall-clock timeout.

Not hidden: files that every user may read (the interpreter, site-packages, world-readable data) —
the program can read them but not change them.

Running as root is required for the namespaces and for switching uid; a non-root caller gets only
the rlimits, the wall-clock timeout, a fresh directory and the socket shim, and a warning: the
program runs as the caller (it can read and write what the caller can), leftover processes are
killed by process group only and ``RLIMIT_NPROC`` is not set (it would count the caller's own
processes). Unprivileged user namespaces are not tried: the program would still act with the
caller's uid on the host, so the uid separation is lost anyway, and many distributions disable
them. Without root, run the HTTP sandbox (``rlvr.sandbox.http``) as root in a container.

The interpreter may live anywhere: a virtualenv under ``/tmp`` or a base interpreter under a private
home (``/root``, mode 0700) is bind-mounted back, read-only, into the mount namespace. Without
namespaces the unprivileged uid must be able to read the interpreter; when it cannot, a system
``python3`` is used instead, and when none works the constructor raises a ``ConfigError`` that says
what to install or set (so a run fails at start-up, never at its first code reward).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from rlvr.sandbox.config import SandboxConfig, SandboxResult
from rlvr.utils.errors import ConfigError, RewardError

logger = logging.getLogger(__name__)

RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_runner.py")
SETUP_FAILED = 121
_LOCK_DIR = os.path.join(tempfile.gettempdir(), "rlvr-sandbox-uids")
SYSTEM_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")
"""Interpreters tried, in order, when the current one is unreadable by the sandbox uid (basic isolation)."""
_CHOSEN: dict[tuple[str, str, int], tuple[str, "_Isolation"]] = {}
_PREFIXES: dict[str, list[str]] = {}


@dataclass
class _Isolation:
    netns: bool
    pidns: bool
    mountns: bool
    drop_uid: bool


@dataclass
class SandboxJob:
    """One program to run: source code and the text fed to its stdin."""

    code: str
    stdin: str = ""


class _UidLease:
    """An exclusive lease on one uid of the pool, held with ``flock`` (released if the holder dies)."""

    def __init__(self, config: SandboxConfig) -> None:
        os.makedirs(_LOCK_DIR, mode=0o700, exist_ok=True)
        offsets = random.sample(range(config.uid_count), k=min(config.uid_count, 256))
        for offset in offsets:
            uid = config.uid_base + offset
            fd = os.open(os.path.join(_LOCK_DIR, f"{uid}.lock"), os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self.uid, self._fd = uid, fd
            return
        raise RewardError(
            f"no free sandbox uid in [{config.uid_base}, {config.uid_base + config.uid_count}); "
            "lower sandbox max_concurrency or raise uid_count"
        )

    def release(self) -> None:
        os.close(self._fd)


class LocalSandbox:
    """Runs Python programs in isolated subprocesses; thread-safe, see the module docstring.

    Args:
        config: limits and isolation level.
    """

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config or SandboxConfig()
        if self.config.isolation not in ("auto", "namespaces", "basic"):
            raise ConfigError("sandbox.isolation", f"must be 'auto', 'namespaces' or 'basic', got {self.config.isolation!r}")
        if self.config.max_concurrency < 1 or self.config.wall_timeout_s <= 0 or self.config.cpu_seconds < 1:
            raise ConfigError("sandbox", "max_concurrency, wall_timeout_s and cpu_seconds must be positive")
        key = (self.config.python_executable, self.config.isolation, os.geteuid())
        if key not in _CHOSEN:
            _CHOSEN[key] = self._choose_isolation()
        self.python, self.isolation = _CHOSEN[key]

    def _choose_isolation(self) -> tuple[str, _Isolation]:
        """``(interpreter, isolation)``: full isolation when the kernel allows it, else the basic
        layers with an interpreter the sandbox uid can read. Probed once per process and setting."""
        mode, given = self.config.isolation, self.config.python_executable
        is_root = os.geteuid() == 0
        full = _Isolation(netns=True, pidns=True, mountns=True, drop_uid=True)
        basic = _Isolation(netns=False, pidns=False, mountns=False, drop_uid=is_root)
        python = given or sys.executable
        if not (os.path.isfile(python) and os.access(python, os.X_OK)):
            raise ConfigError("sandbox.python_executable", f"{python!r} is not an executable file; give the path "
                              "of a Python interpreter (e.g. /usr/bin/python3) or leave it empty for the current one")
        if mode != "basic" and is_root:
            probe = self._probe(python, full)
            if probe.passed:
                return python, full
            logger.warning("code sandbox: namespaces unavailable (%s)", probe.stderr.strip()[-200:])
        if mode == "namespaces":
            raise ConfigError(
                "sandbox.isolation", "'namespaces' needs root and unshare(2) permission (net, mount, pid); "
                "run as root / in a privileged container, or set isolation='auto' or 'basic'"
            )
        if mode == "auto":
            logger.warning(
                "code sandbox: falling back to uid + rlimits + socket shim, which does not stop native "
                "code from opening sockets or writing to /tmp"
            )
        failures = []
        for candidate in [python] if given else _unique([python, *SYSTEM_PYTHONS]):
            if not os.access(candidate, os.X_OK):
                continue
            probe = self._probe(candidate, basic)
            if probe.passed:
                if candidate != python:
                    logger.warning("code sandbox: %s is not readable by the sandbox uid; programs run with %s",
                                   python, candidate)
                return candidate, basic
            failures.append(f"{candidate}: {(probe.stderr.strip().splitlines() or ['no output'])[-1][-200:]}")
        raise ConfigError(
            "sandbox.python_executable",
            "without namespaces the code sandbox runs programs as an unprivileged user, and no interpreter "
            f"it tried can be run by that user ({'; '.join(failures) or 'none found'}). Run as root on a "
            "kernel that allows unshare(2) (full isolation), or set python_executable to an interpreter "
            "whose files every user can read (e.g. /usr/bin/python3: `apt-get install python3`)",
        )

    def _probe(self, python: str, isolation: _Isolation) -> SandboxResult:
        self.python, self.isolation = python, isolation
        return self.run("import json\nprint(json.dumps('ok'))")

    def run(self, code: str, stdin: str = "") -> SandboxResult:
        """Run ``code`` as ``__main__`` with ``stdin``; never raises for a failing program."""
        lease = _UidLease(self.config) if self.isolation.drop_uid else None
        root = tempfile.mkdtemp(prefix="rlvr-sbx-")
        try:
            return self._run_in(root, code, stdin, None if lease is None else lease.uid)
        finally:
            shutil.rmtree(root, ignore_errors=True)
            if lease is not None:
                lease.release()

    def _run_in(self, root: str, code: str, stdin: str, uid: int | None) -> SandboxResult:
        workdir = os.path.join(root, "job")
        os.mkdir(workdir, 0o700)
        os.chmod(root, 0o711)
        program = os.path.join(workdir, "main.py")
        with open(program, "w", encoding="utf-8") as f:
            f.write(code)
        if uid is not None:
            os.chown(workdir, uid, uid)
            os.chown(program, uid, uid)
        spec = self._spec(workdir, uid)
        paths = {name: os.path.join(root, name) for name in ("stdin", "stdout", "stderr")}
        with open(paths["stdin"], "w", encoding="utf-8") as f:
            f.write(stdin)
        start = time.monotonic()
        with open(paths["stdin"], "rb") as fin, open(paths["stdout"], "wb") as fout, open(paths["stderr"], "wb") as ferr:
            proc = subprocess.Popen(
                [self.python, "-I", RUNNER, json.dumps(spec)],
                stdin=fin, stdout=fout, stderr=ferr, cwd=root, start_new_session=True,
            )
            timed_out = self._wait(proc, uid)
        elapsed = time.monotonic() - start
        stdout, stderr = self._read(paths["stdout"]), self._read(paths["stderr"])
        return SandboxResult(self._status(proc.returncode, timed_out), proc.returncode, stdout, stderr, elapsed)

    def _spec(self, workdir: str, uid: int | None) -> dict:
        c, iso = self.config, self.isolation
        return {
            "workdir": workdir, "program": "main.py", "uid": uid,
            "netns": iso.netns, "pidns": iso.pidns, "mountns": iso.mountns,
            "cpu_seconds": c.cpu_seconds, "memory_bytes": c.memory_bytes, "file_bytes": c.file_bytes,
            "tmpfs_bytes": c.tmpfs_bytes, "expose_paths": _prefixes(self.python), "max_processes": c.max_processes, "max_open_files": c.max_open_files,
        }

    def _wait(self, proc: subprocess.Popen, uid: int | None) -> bool:
        """Wait up to the wall timeout; on timeout kill the process group (and the uid's processes)."""
        try:
            proc.wait(timeout=self.config.wall_timeout_s)
            return False
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)
        if uid is not None and not self.isolation.pidns:
            _kill_uid(uid)
        return True

    def _read(self, path: str) -> str:
        with open(path, "rb") as f:
            data = f.read(self.config.max_output_chars * 4)
        return data.decode("utf-8", errors="replace")[: self.config.max_output_chars]

    @staticmethod
    def _status(code: int | None, timed_out: bool) -> str:
        if timed_out:
            return "timeout"
        if code == 0:
            return "ok"
        if code == SETUP_FAILED:
            return "sandbox_error"
        if code is not None and (code < 0 or code > 128):
            return "killed"
        return "runtime_error"

    def run_many(self, jobs: list[SandboxJob]) -> list[SandboxResult]:
        """Run several programs concurrently (at most ``max_concurrency`` at a time), results in order."""
        if not jobs:
            return []
        with ThreadPoolExecutor(max_workers=self.config.max_concurrency) as pool:
            return list(pool.map(lambda job: self.run(job.code, job.stdin), jobs))


def _prefixes(python: str) -> list[str]:
    """Install prefixes of ``python`` (its venv and base interpreter, as the interpreter itself reports
    them, plus their resolved paths), made reachable inside the mount namespace."""
    if python not in _PREFIXES:
        if os.path.abspath(python) == os.path.abspath(sys.executable):  # a venv's python is a symlink
            found = [sys.prefix, sys.base_prefix]
        else:
            query = "import sys; print(sys.prefix); print(sys.base_prefix)"
            out = subprocess.run([python, "-I", "-c", query], capture_output=True, text=True, timeout=30, check=True)
            found = out.stdout.split()
        _PREFIXES[python] = sorted({*found, *(os.path.realpath(p) for p in found)})
    return _PREFIXES[python]


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _kill_uid(uid: int) -> None:
    """Kill every process owned by ``uid`` (``kill(-1)`` from a helper running as that uid)."""
    subprocess.run(
        ["/bin/kill", "-KILL", "-1"],
        user=uid, group=uid, extra_groups=[], timeout=10, check=False,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
