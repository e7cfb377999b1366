"""The local backend, the workers and the benchmark's rlvr side import without Ray (GPU machines
that cannot carry Ray's wheel run through the local backend)."""

import subprocess
import sys
from pathlib import Path

from rlvr.single_controller import get_worker_group_cls

REPO = Path(__file__).resolve().parents[2]

BLOCK_RAY = """
import builtins, sys
real_import = builtins.__import__
def guarded(name, *args, **kwargs):
    if name == "ray" or name.startswith("ray."):
        raise ImportError("ray is blocked for this test")
    return real_import(name, *args, **kwargs)
builtins.__import__ = guarded
from rlvr.single_controller import ClassWithInitArgs, LocalResourcePool, LocalWorkerGroup, get_worker_group_cls
from rlvr.workers.engine_workers import ActorRolloutRefWorker
import benchmarks.rlvr_side
assert get_worker_group_cls("local") is LocalWorkerGroup
assert "ray" not in sys.modules
print("imported without ray")
"""


def test_local_path_imports_without_ray():
    result = subprocess.run(
        [sys.executable, "-c", BLOCK_RAY], cwd=REPO, capture_output=True, text=True, timeout=300,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "imported without ray" in result.stdout


def test_ray_backend_is_still_found_by_name():
    from rlvr.single_controller.ray.base import RayWorkerGroup

    assert get_worker_group_cls("ray") is RayWorkerGroup
