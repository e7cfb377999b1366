"""Rehearse the GPU machine's Python environment on this machine: block the imports it cannot do.

The lent GPU machine has its own fixed set of Python distributions (``gpu_machine_packages.txt``)
plus the wheels carried in ``.whl/`` (``prepare_gpu_bundle.sh``). :func:`install` puts a finder in
front of ``sys.meta_path`` that refuses every top-level third-party module whose distribution is
in neither set, with the error the GPU machine would give, so that the CPU rehearsal of
``benchmarks/gpu_checks.py`` fails here on an import the GPU machine lacks. Standard-library
modules, the repository's own (``rlvr``, ``benchmarks``, ``tests``) and modules of no installed
distribution pass.
"""

from __future__ import annotations

import importlib.abc
import importlib.metadata
import re
import sys
from pathlib import Path

__all__ = ["gpu_machine_packages", "carried_packages", "install", "normalize"]

HERE = Path(__file__).resolve().parent
PACKAGES_FILE = HERE / "gpu_machine_packages.txt"


def normalize(name: str) -> str:
    """PEP 503 form of a distribution name (``Foo_Bar.baz`` -> ``foo-bar-baz``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def gpu_machine_packages() -> set[str]:
    """The distributions installed on the GPU machine (normalised names)."""
    lines = PACKAGES_FILE.read_text().splitlines()
    return {normalize(line.strip()) for line in lines if line.strip() and not line.startswith("#")}


def carried_packages(wheel_dir: Path) -> set[str]:
    """The distributions of the wheels in ``wheel_dir`` (``name-version-...whl``)."""
    return {normalize(path.name.split("-")[0]) for path in wheel_dir.glob("*.whl")}


class _Blocker(importlib.abc.MetaPathFinder):
    def __init__(self, allowed: set[str]) -> None:
        self.allowed = allowed
        self.distributions = importlib.metadata.packages_distributions()

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001 - the finder protocol
        if "." in fullname or fullname in sys.stdlib_module_names:
            return None
        dists = {normalize(d) for d in self.distributions.get(fullname, [])}
        if not dists or dists & self.allowed:
            return None
        raise ModuleNotFoundError(
            f"No module named {fullname!r} on the GPU machine (distribution {', '.join(sorted(dists))} is neither "
            "installed there nor carried in .whl/; add its wheel to benchmarks/prepare_gpu_bundle.sh)", name=fullname)


def install(wheel_dir: Path) -> None:
    """Block the imports the GPU machine cannot do (see the module docstring); idempotent."""
    if any(isinstance(finder, _Blocker) for finder in sys.meta_path):
        return
    sys.meta_path.insert(0, _Blocker(gpu_machine_packages() | carried_packages(wheel_dir)))
