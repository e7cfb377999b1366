"""Child-side launcher of the code sandbox; run as ``python -I _runner.py SPEC_JSON``.

This file is executed as a separate script (it imports nothing from rlvr) by
:class:`rlvr.sandbox.local.LocalSandbox`. It starts as root and, in order:

1. enters new network, mount and PID namespaces (``unshare(2)``) when the spec asks for them —
   no network interface but a downed loopback, and a private mount table;
2. in the mount namespace, mounts small throw-away tmpfs file systems over ``/tmp``, ``/var/tmp``
   and ``/dev/shm`` and bind-mounts the job directory at ``/tmp/sandbox`` — so nothing the program
   writes outside its directory survives it, and the world-writable host directories are hidden;
   the interpreter's prefixes (a virtualenv under ``/tmp``, a base interpreter under a private
   home such as ``/root``) are bind-mounted back read-only, alone, at their own paths;
3. sets resource limits (CPU seconds, address space, file size, open files, no core dumps);
4. forks the *init* process (PID 1 of the new PID namespace), which drops to an unprivileged uid/gid
   with no supplementary groups, applies ``RLIMIT_NPROC`` (enforced only for non-root uids), and
   forks the program, which runs the user's file with ``runpy``. When the program ends, init exits,
   and the kernel kills every process left in the namespace (fork bombs, daemons).

Without a PID namespace, init kills every process of the sandbox uid with ``kill(-1, SIGKILL)``
instead (the uid is unique per concurrent run). Without a network namespace, ``socket.socket`` is
replaced by a class that refuses to open sockets — a weaker guard (``ctypes`` can get around it).

Exit status: the program's exit code, ``128 + signal`` if a signal killed it, or 121 if the
isolation could not be set up (the message is on stderr).
"""

import ctypes
import json
import os
import resource
import signal
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
SETUP_FAILED = 121
SANDBOX_MOUNT = "/tmp/sandbox"
MASKED_DIRS = ("/tmp", "/var/tmp", "/dev/shm")

_libc = ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    _check(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")


def _enter_namespaces(spec: dict) -> str:
    """Unshare the requested namespaces and set up the mounts; returns the program's cwd."""
    flags = (CLONE_NEWNET if spec["netns"] else 0) | (CLONE_NEWPID if spec["pidns"] else 0)
    flags |= CLONE_NEWNS if spec["mountns"] else 0
    if flags:
        _check(_libc.unshare(flags), "unshare")
    if not spec["mountns"]:
        return spec["workdir"]
    _mount("none", "/", None, MS_REC | MS_PRIVATE, None)
    job_fd = os.open(spec["workdir"], os.O_PATH | os.O_DIRECTORY)
    hidden = _hidden_paths(spec["expose_paths"])  # opened before the masks hide them
    size = f"size={spec['tmpfs_bytes']},mode=1777"
    for target in MASKED_DIRS:
        if os.path.isdir(target):
            _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, size)
    os.mkdir(SANDBOX_MOUNT, 0o755)
    _mount(f"/proc/self/fd/{job_fd}", SANDBOX_MOUNT, None, MS_BIND, None)
    os.close(job_fd)
    _expose(hidden, size.replace("1777", "755"))
    return SANDBOX_MOUNT


def _hiding_ancestor(path: str) -> str | None:
    """The first directory above ``path`` that hides it from the sandbox uid: one of the masked
    directories (covered by a fresh tmpfs) or one that other users cannot traverse (e.g. ``/root``
    with mode 0700). None when ``path`` stays reachable as it is."""
    parts = path.strip("/").split("/")
    for depth in range(1, len(parts)):
        ancestor = "/" + "/".join(parts[:depth])
        if ancestor in MASKED_DIRS or not os.stat(ancestor).st_mode & 0o001:
            return ancestor
    return None


def _hidden_paths(paths: list[str]) -> list[tuple[str, str, int]]:
    """``(path, hiding ancestor, O_PATH fd)`` for each path (the interpreter's prefixes) that the
    mounts would hide; a path inside another exposed one is left out (it comes with it)."""
    chosen: list[str] = []
    for path in sorted({os.path.abspath(p) for p in paths}, key=len):
        if not any(path == c or path.startswith(c + "/") for c in chosen):
            chosen.append(path)
    hidden = []
    for path in chosen:
        ancestor = _hiding_ancestor(path)
        if ancestor is not None:
            hidden.append((path, ancestor, os.open(path, os.O_PATH | os.O_DIRECTORY)))
    return hidden


def _expose(hidden: list[tuple[str, str, int]], tmpfs_options: str) -> None:
    """Make each hidden path reachable, read-only, by the sandbox uid and nothing beside it.

    A non-traversable ancestor is covered by an empty tmpfs (a masked directory already is one);
    inside it the directories down to the path are created afresh (mode 0755) and the path itself
    is bind-mounted back, so the interpreter's files become readable while the rest of the ancestor
    (other users' homes, other projects under ``/tmp``) stays out of sight.
    """
    os.umask(0o022)
    for ancestor in sorted({a for _, a, _ in hidden if a not in MASKED_DIRS}):
        _mount("tmpfs", ancestor, "tmpfs", MS_NOSUID | MS_NODEV, tmpfs_options)
    for path, _, fd in hidden:
        os.makedirs(path, mode=0o755, exist_ok=True)
        _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC, None)
        _mount("none", path, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, None)
        os.close(fd)


def _set_limits(spec: dict) -> None:
    cpu = int(spec["cpu_seconds"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (spec["memory_bytes"], spec["memory_bytes"]))
    resource.setrlimit(resource.RLIMIT_FSIZE, (spec["file_bytes"], spec["file_bytes"]))
    resource.setrlimit(resource.RLIMIT_NOFILE, (spec["max_open_files"], spec["max_open_files"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _block_sockets() -> None:
    import socket

    class _NoSocket(socket.socket):
        def __init__(self, *args, **kwargs):
            raise PermissionError("network access is disabled in the rlvr sandbox")

    socket.socket = _NoSocket
    socket.create_connection = lambda *a, **k: _NoSocket()
    socket.socketpair = lambda *a, **k: _NoSocket()


def _run_program(spec: dict) -> None:
    """Body of the program process: never returns."""
    import runpy
    import traceback

    code = 0
    try:
        if not spec["netns"]:
            _block_sockets()
        sys.argv = [spec["program"]]
        sys.path.insert(0, os.getcwd())
        runpy.run_path(spec["program"], run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # the user's program failed: report like the interpreter does
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _status(wait_status: int) -> int:
    if os.WIFSIGNALED(wait_status):
        return 128 + os.WTERMSIG(wait_status)
    return os.WEXITSTATUS(wait_status)


def _init(spec: dict, cwd: str) -> None:
    """PID 1 of the sandbox: drop privileges, run the program, reap, clean up. Never returns."""
    uid = spec["uid"]
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        resource.setrlimit(resource.RLIMIT_NPROC, (spec["max_processes"], spec["max_processes"]))
    os.chdir(cwd)
    program = os.fork()
    if program == 0:
        _run_program(spec)
    _, wait_status = os.waitpid(program, 0)
    if not spec["pidns"] and uid is not None:
        os.kill(-1, signal.SIGKILL)  # every other process of the sandbox uid
    os._exit(_status(wait_status))


def main() -> None:
    spec = json.loads(sys.argv[1])
    try:
        cwd = _enter_namespaces(spec)
        _set_limits(spec)
    except OSError as exc:
        print(f"rlvr sandbox: isolation setup failed: {exc}", file=sys.stderr)
        os._exit(SETUP_FAILED)
    init = os.fork()
    if init == 0:
        _init(spec, cwd)
    _, wait_status = os.waitpid(init, 0)
    os._exit(_status(wait_status))


if __name__ == "__main__":
    main()
