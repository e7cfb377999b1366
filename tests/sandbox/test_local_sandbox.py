"""The local sandbox contains hostile programs and leaves the host untouched."""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid

import pytest

from rlvr.sandbox import LocalSandbox, SandboxConfig, SandboxJob
from rlvr.sandbox import local as sandbox_local
from rlvr.utils.errors import ConfigError

WALL = 3.0
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="uid switch, NPROC and namespaces need root")


def _readable_by_others(path: str) -> bool:
    """Whether a user other than the owner can reach and read ``path`` (every ancestor traversable)."""
    parts = os.path.abspath(path).strip("/").split("/")
    ancestors = ["/" + "/".join(parts[:depth]) for depth in range(1, len(parts) + 1)]
    return all(os.stat(a).st_mode & 0o001 for a in ancestors) and bool(os.stat(path).st_mode & 0o004)


BASE_PYTHON_IS_PRIVATE = not _readable_by_others(os.path.join(sys.base_prefix, "lib"))


@pytest.fixture(scope="module")
def private_tmp_venv():
    """A virtualenv inside a mode-0700 directory under /tmp (a project cloned into /tmp), with a
    secret file beside it; yields ``(directory, venv python)``."""
    home = tempfile.mkdtemp(prefix="rlvr-private-", dir="/tmp")
    os.chmod(home, 0o700)
    with open(os.path.join(home, "secret.txt"), "w") as f:
        f.write("secret")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", os.path.join(home, "venv")], check=True, timeout=120)
    yield home, os.path.join(home, "venv", "bin", "python")
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module", params=["current_python", "venv_in_private_tmp_dir"])
def sandbox(request):
    """The hostile-program tests run with the test's own interpreter and with one that lives where a
    fresh clone under /tmp puts it (a venv in a private directory under /tmp, whose mount namespace
    covers /tmp with a tmpfs)."""
    python = ""
    if request.param == "venv_in_private_tmp_dir":
        python = request.getfixturevalue("private_tmp_venv")[1]
    config = SandboxConfig(wall_timeout_s=WALL, cpu_seconds=2, memory_bytes=1 << 30, max_concurrency=2,
                           python_executable=python)
    return LocalSandbox(config)


def _sandbox_processes(config: SandboxConfig) -> list[str]:
    out = subprocess.run(["ps", "-eo", "uid=,pid=,stat="], capture_output=True, text=True, timeout=10).stdout
    low, high = config.uid_base, config.uid_base + config.uid_count
    return [line for line in out.splitlines() if low <= int(line.split()[0]) < high and "Z" not in line.split()[2]]


@needs_root
def test_uses_full_isolation_as_root(sandbox):
    assert (sandbox.isolation.netns, sandbox.isolation.pidns, sandbox.isolation.mountns) == (True, True, True)


def test_stdin_stdout_and_exit_codes(sandbox):
    ok = sandbox.run("a, b = map(int, input().split())\nprint(a + b)", "2 40\n")
    assert (ok.status, ok.exit_code, ok.stdout) == ("ok", 0, "42\n")
    failed = sandbox.run("assert 1 == 2, 'nope'")
    assert failed.status == "runtime_error" and failed.exit_code == 1 and "AssertionError: nope" in failed.stderr
    exited = sandbox.run("import sys; sys.exit(3)")
    assert (exited.status, exited.exit_code) == ("runtime_error", 3)


@needs_root
def test_runs_as_unprivileged_uid_in_fresh_directory(sandbox):
    code = "import os\nprint(os.getuid(), os.getgid(), os.listdir('.'))\nopen('out.txt', 'w').write('hi')"
    result = sandbox.run(code)
    uid, gid, listing = result.stdout.split(" ", 2)
    assert result.passed and int(uid) >= sandbox.config.uid_base and uid == gid
    assert listing.strip() == "['main.py']"


def test_infinite_loop_is_killed_within_the_limit(sandbox):
    start = time.monotonic()
    result = sandbox.run("while True:\n    pass")
    assert not result.passed and result.status in ("killed", "timeout")
    assert time.monotonic() - start < WALL + 2.0


def test_sleeping_program_hits_the_wall_clock_timeout(sandbox):
    result = sandbox.run("import time\ntime.sleep(60)")
    assert result.status == "timeout" and WALL <= result.wall_time_s < WALL + 2.0


def test_allocating_20_gb_fails(sandbox):
    result = sandbox.run("x = bytearray(20 * 2**30)\nprint('allocated')")
    assert result.status == "runtime_error" and "MemoryError" in result.stderr and "allocated" not in result.stdout


@needs_root
def test_fork_bomb_is_contained(sandbox):
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    start = time.monotonic()
    result = sandbox.run(bomb)
    assert not result.passed and time.monotonic() - start < WALL + 3.0
    time.sleep(0.3)
    assert _sandbox_processes(sandbox.config) == []
    assert subprocess.run(["true"], timeout=10).returncode == 0  # the host can still start processes


@needs_root
def test_writes_outside_the_directory_fail_or_vanish(sandbox, tmp_path):
    marker = f"/tmp/rlvr_escape_{uuid.uuid4().hex}"
    target = tmp_path / "escape.txt"
    os.chmod(tmp_path, 0o777)  # even a world-writable host directory must stay untouched
    code = (
        "import os\nresults = []\n"
        f"for path in ['../escape', '../../escape', {marker!r}, {str(target)!r}, '/etc/escape', '/work/escape']:\n"
        "    try:\n        open(path, 'w').write('x')\n        results.append('wrote')\n"
        "    except OSError as exc:\n        results.append(type(exc).__name__)\n"
        "print(results)"
    )
    result = sandbox.run(code)
    assert result.passed, result.stderr
    assert not os.path.exists(marker) and not target.exists()
    assert not os.path.exists("/etc/escape") and not os.path.exists("/work/escape")


def test_network_is_unreachable(sandbox):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    accepted = []
    threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True).start()
    try:
        code = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')"
        result = sandbox.run(code)
    finally:
        server.close()
    assert result.status == "runtime_error" and "connected" not in result.stdout and accepted == []


def test_endless_output_is_cut_by_the_file_size_limit():
    sandbox = LocalSandbox(SandboxConfig(wall_timeout_s=WALL, cpu_seconds=2, file_bytes=1 << 20, max_output_chars=1000))
    result = sandbox.run("while True:\n    print('x' * 1000)")
    assert not result.passed and len(result.stdout) == 1000


def test_run_many_keeps_order_and_runs_concurrently(sandbox):
    jobs = [SandboxJob("import time\ntime.sleep(0.5)\nprint(input())", f"{i}\n") for i in range(4)]
    start = time.monotonic()
    results = sandbox.run_many(jobs)
    assert [r.stdout.strip() for r in results] == ["0", "1", "2", "3"]
    assert time.monotonic() - start < 4 * 0.5 + 0.3  # 2 at a time: about 1 s plus start-up


@needs_root
def test_basic_isolation_blocks_sockets_with_the_shim():
    config = SandboxConfig(wall_timeout_s=WALL, cpu_seconds=2, isolation="basic", python_executable="/usr/bin/python3")
    sandbox = LocalSandbox(config)
    result = sandbox.run("import socket\nsocket.socket()")
    assert result.status == "runtime_error" and "network access is disabled" in result.stderr
    bomb = sandbox.run("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass")
    assert not bomb.passed
    time.sleep(0.3)
    assert _sandbox_processes(config) == []


@needs_root
def test_interpreter_under_private_tmp_dir_is_exposed_read_only_and_alone(private_tmp_venv):
    home, python = private_tmp_venv
    sandbox = LocalSandbox(SandboxConfig(wall_timeout_s=WALL, python_executable=python))
    assert sandbox.isolation.mountns and sandbox.python == python
    code = (
        "import os, sys\n"
        f"print(sys.prefix, sorted(os.listdir({home!r})), os.path.exists({home + '/secret.txt'!r}))\n"
        "try:\n    open(os.path.join(sys.prefix, 'x'), 'w')\nexcept OSError as exc:\n    print(type(exc).__name__)"
    )
    result = sandbox.run(code)
    assert result.passed, result.stderr
    prefix, listing, secret_visible, write_error = result.stdout.split(maxsplit=3)
    assert prefix == os.path.join(home, "venv") and listing == "['venv']" and secret_visible == "False"
    assert write_error.strip() in ("PermissionError", "OSError")
    assert not os.path.exists(os.path.join(home, "venv", "x"))


@needs_root
@pytest.mark.skipif(not BASE_PYTHON_IS_PRIVATE or not os.access("/usr/bin/python3", os.X_OK),
                    reason="needs a base interpreter other users cannot read, and /usr/bin/python3")
def test_basic_isolation_falls_back_to_a_readable_system_python():
    sandbox = LocalSandbox(SandboxConfig(wall_timeout_s=WALL, cpu_seconds=2, isolation="basic"))
    assert sandbox.python == "/usr/bin/python3" and not sandbox.isolation.mountns
    assert sandbox.run("print(6 * 7)").stdout == "42\n"


@needs_root
@pytest.mark.skipif(not BASE_PYTHON_IS_PRIVATE, reason="needs a base interpreter other users cannot read")
def test_basic_isolation_with_an_unreadable_interpreter_fails_at_construction(private_tmp_venv):
    config = SandboxConfig(isolation="basic", python_executable=private_tmp_venv[1])
    with pytest.raises(ConfigError, match="(?s)sandbox.python_executable.*/usr/bin/python3"):
        LocalSandbox(config)


def test_no_usable_interpreter_is_a_config_error_that_says_what_to_do(monkeypatch):
    failed = sandbox_local.SandboxResult("runtime_error", 1, "", "ModuleNotFoundError: No module named 'json'", 0.1)
    monkeypatch.setattr(LocalSandbox, "_probe", lambda self, python, isolation: failed)
    monkeypatch.setattr(sandbox_local, "_CHOSEN", {})
    with pytest.raises(ConfigError) as info:
        LocalSandbox(SandboxConfig(isolation="basic", python_executable="/usr/bin/python3"))
    message = str(info.value)
    assert "sandbox.python_executable" in message and "No module named 'json'" in message
    assert "readable" in message or "read" in message


def test_invalid_config_is_rejected():
    with pytest.raises(ConfigError, match="sandbox.isolation"):
        LocalSandbox(SandboxConfig(isolation="docker"))
    with pytest.raises(ConfigError, match="must be positive"):
        LocalSandbox(SandboxConfig(max_concurrency=0))
