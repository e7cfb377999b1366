"""Configuration and result types of the code sandbox."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from rlvr.utils.errors import ConfigError

SandboxStatus = Literal["ok", "runtime_error", "timeout", "killed", "sandbox_error"]


@dataclass
class SandboxConfig:
    """Limits and isolation of one sandboxed program run (see ``rlvr/sandbox/_runner.py``)."""

    wall_timeout_s: float = field(default=10.0, metadata={"help": "wall-clock limit per run; the whole process tree is killed after it"})
    cpu_seconds: int = field(default=10, metadata={"help": "RLIMIT_CPU of the program (SIGXCPU, then SIGKILL one second later)"})
    memory_bytes: int = field(default=2 << 30, metadata={"help": "RLIMIT_AS address-space limit of the program"})
    file_bytes: int = field(default=16 << 20, metadata={"help": "RLIMIT_FSIZE: largest file (and captured stdout/stderr) the program may write"})
    tmpfs_bytes: int = field(default=16 << 20, metadata={"help": "size of the throw-away tmpfs mounted over /tmp, /var/tmp and /dev/shm"})
    max_processes: int = field(default=32, metadata={"help": "RLIMIT_NPROC of the sandbox uid (contains fork bombs)"})
    max_open_files: int = field(default=128, metadata={"help": "RLIMIT_NOFILE of the program"})
    max_output_chars: int = field(default=65536, metadata={"help": "stdout/stderr kept in the result (the rest is cut)"})
    isolation: str = field(default="auto", metadata={"help": "namespaces: require net/mount/pid namespaces; basic: uid + rlimits + socket shim only; auto: namespaces when the kernel allows, else basic with a warning", "choices": ("auto", "namespaces", "basic")})
    uid_base: int = field(default=1_200_000, metadata={"help": "first unprivileged uid used for sandboxed programs (one uid per concurrent run)"})
    uid_count: int = field(default=4096, metadata={"help": "number of uids in the pool starting at uid_base"})
    python_executable: str = field(default="", metadata={"help": "interpreter that runs the programs (empty: the current one, or under basic isolation a system python3 when the sandbox uid cannot read the current one); with basic isolation it must be readable by other users"})
    max_concurrency: int = field(default=2, metadata={"help": "programs run at the same time by run_many (bounded thread pool)"})


def sandbox_config(values: Mapping[str, Any], where: str) -> SandboxConfig:
    """A :class:`SandboxConfig` from a mapping of its fields (e.g. the python tool's ``config``);
    unknown keys are a :class:`ConfigError` at ``where`` that lists the valid ones."""
    known = sorted(f.name for f in fields(SandboxConfig))
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ConfigError(where, f"unknown key(s) {unknown}; use SandboxConfig fields: {', '.join(known)}")
    return SandboxConfig(**values)


@dataclass
class SandboxResult:
    """Outcome of one program run.

    ``status``: ``ok`` (exit code 0), ``runtime_error`` (non-zero exit, e.g. a failed assert or
    MemoryError), ``killed`` (ended by a signal: CPU limit, file-size limit), ``timeout`` (wall clock
    exceeded, tree killed), ``sandbox_error`` (the sandbox itself could not run the program).
    """

    status: SandboxStatus
    exit_code: int | None
    stdout: str
    stderr: str
    wall_time_s: float

    @property
    def passed(self) -> bool:
        """True when the program ran to completion with exit code 0."""
        return self.status == "ok"
