"""The local sandbox contains hostile programs and leaves the host untouched."""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from rlvr.sandbox import LocalSandbox, SandboxConfig, SandboxJob
from rlvr.sandbox import local as sandbox_local
from rlvr.utils.errors import ConfigError

WALL = 3.0
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="uid switch, NPROC and namespaces need root")


REPO = Path(__file__).resolve().parents[2]


def _private_venv(parent: str):
    """A virtualenv inside a fresh mode-0700 directory under ``parent``, with a secret file beside
    it; yields ``(directory, venv python)``."""
    home = tempfile.mkdtemp(prefix="rlvr-private-", dir=parent)
    os.chmod(home, 0o700)
    with open(os.path.join(home, "secret.txt"), "w") as f:
        f.write("secret")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", os.path.join(home, "venv")], check=True, timeout=120)
    yield home, os.path.join(home, "venv", "bin", "python")
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def private_tmp_venv():
    """A venv where a project cloned into /tmp has it: in a private directory under /tmp (which the
    mount namespace covers with a tmpfs)."""
    yield from _private_venv("/tmp")


@pytest.fixture(scope="module")
def private_home_venv():
    """A venv in a private directory outside /tmp, made here so that the case does not depend on
    where this machine's Python lives: the sandbox uid cannot traverse the directory (like a pyenv
    interpreter under /root, mode 0700), and the mount namespace does not mask it."""
    yield from _private_venv(os.path.expanduser("~"))


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
@pytest.mark.parametrize("where", ["private_tmp_venv", "private_home_venv"])
def test_interpreter_in_a_private_dir_is_exposed_read_only_and_alone(request, where):
    home, python = request.getfixturevalue(where)
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
@pytest.mark.skipif(not os.access("/usr/bin/python3", os.X_OK), reason="needs /usr/bin/python3")
def test_basic_isolation_falls_back_to_a_readable_system_python(monkeypatch, private_home_venv):
    """The current interpreter is one the sandbox uid cannot run (it lives in a private home)."""
    monkeypatch.setattr(sys, "executable", private_home_venv[1])
    monkeypatch.setattr(sandbox_local, "_CHOSEN", {})
    sandbox = LocalSandbox(SandboxConfig(wall_timeout_s=WALL, cpu_seconds=2, isolation="basic"))
    assert sandbox.python == "/usr/bin/python3" and not sandbox.isolation.mountns
    assert sandbox.run("print(6 * 7)").stdout == "42\n"


@needs_root
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


CHECKOUT_RUN = """
import json, sys
import rlvr
from rlvr.sandbox import LocalSandbox, SandboxConfig
sandbox = LocalSandbox(SandboxConfig(wall_timeout_s=10, cpu_seconds=1))
results = {"rlvr": rlvr.__file__}
for name, code in json.loads(sys.argv[1]).items():
    result = sandbox.run(code)
    results[name] = [result.status, result.stdout, result.stderr[-300:]]
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def private_tmp_checkout():
    """A copy of the rlvr package in a mode-0700 directory under /tmp: a project cloned into /tmp."""
    home = tempfile.mkdtemp(prefix="rlvr-checkout-", dir="/tmp")
    os.chmod(home, 0o700)
    shutil.copytree(REPO / "rlvr", os.path.join(home, "rlvr"), ignore=shutil.ignore_patterns("__pycache__"))
    yield home
    shutil.rmtree(home, ignore_errors=True)


def _run_from_checkout(checkout: str, programs: dict[str, str]) -> dict:
    """Each program's ``[status, stdout, stderr tail]`` from a sandbox that this interpreter imports
    from ``checkout`` (a separate process whose only rlvr is that copy)."""
    done = subprocess.run([sys.executable, "-c", CHECKOUT_RUN, json.dumps(programs)], cwd=checkout, timeout=120,
                          env={"PYTHONPATH": checkout, "PATH": os.environ["PATH"]}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.splitlines()[-1])
    assert results.pop("rlvr") == os.path.join(checkout, "rlvr", "__init__.py")
    return results


def test_the_sandbox_works_from_a_checkout_in_a_private_tmp_dir(private_tmp_checkout):
    """A normal program runs; an endless loop is ended by the CPU limit (1 s, well before the 10 s
    wall clock); a connection to a port listening on the host is refused."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.1)
    connect = f"import socket\nsocket.create_connection(('127.0.0.1', {server.getsockname()[1]}), timeout=2)\nprint('in')"
    try:
        results = _run_from_checkout(private_tmp_checkout, {
            "normal": "print(sum(range(10)))", "loop": "while True:\n    pass", "connect": connect})
        with pytest.raises(TimeoutError):
            server.accept()
    finally:
        server.close()
    assert results["normal"] == ["ok", "45\n", ""]
    assert results["loop"][0] == "killed"
    status, stdout, stderr = results["connect"]
    assert status == "runtime_error" and stdout == "", stderr
    assert stderr.strip().splitlines()[-1] in ("OSError: [Errno 101] Network is unreachable",  # no interface
                                               "PermissionError: network access is disabled in the rlvr sandbox")


@needs_root
def test_from_a_checkout_in_a_private_tmp_dir_writes_outside_the_job_dir_vanish(private_tmp_checkout):
    """The write to /tmp lands in the run's throw-away tmpfs; the checkout is out of sight."""
    marker = f"/tmp/rlvr_escape_{uuid.uuid4().hex}"
    into_checkout = os.path.join(private_tmp_checkout, "rlvr", "escape.py")
    code = (f"for path in [{marker!r}, {into_checkout!r}]:\n"
            "    try:\n        open(path, 'w').write('x')\n    except OSError as exc:\n        print(type(exc).__name__)")
    assert _run_from_checkout(private_tmp_checkout, {"write": code})["write"] == ["ok", "FileNotFoundError\n", ""]
    assert not os.path.exists(marker) and not os.path.exists(into_checkout)
