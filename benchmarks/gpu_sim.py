"""Rehearse the GPU machine's Python environment on this machine: block the imports it cannot do.

The lent GPU machine has its own fixed set of Python distributions (``gpu_machine_packages.txt``)
plus the wheels carried in ``.whl/`` (``gpu_bundle_wheels.txt``, fetched by
``prepare_gpu_bundle.sh``). :func:`install` puts a finder in front of ``sys.meta_path`` that
refuses a top-level third-party module whose distribution is in neither set, with the error the
GPU machine would give, so that the CPU rehearsal of ``benchmarks/gpu_checks.py`` fails here on an
import the GPU machine lacks.

Only imports made by the repository's own code (``rlvr``, ``benchmarks``, ``tests``) and by the
carried packages are checked: a package installed on the GPU machine brings its own dependencies
there, which may differ from what the same package (in another version) imports here.
Standard-library modules and modules of no installed distribution always pass.
"""

from __future__ import annotations

import importlib.abc
import importlib.metadata
import importlib.util
import re
import sys
from pathlib import Path

__all__ = ["gpu_machine_packages", "carried_packages", "install", "normalize"]

HERE = Path(__file__).resolve().parent
PACKAGES_FILE = HERE / "gpu_machine_packages.txt"
WHEELS_FILE = HERE / "gpu_bundle_wheels.txt"


def normalize(name: str) -> str:
    """PEP 503 form of a distribution name (``Foo_Bar.baz`` -> ``foo-bar-baz``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def gpu_machine_packages() -> set[str]:
    """The distributions installed on the GPU machine (normalised names)."""
    lines = PACKAGES_FILE.read_text().splitlines()
    return {normalize(line.strip()) for line in lines if line.strip() and not line.startswith("#")}


def carried_packages() -> set[str]:
    """The distributions carried as wheels (``gpu_bundle_wheels.txt``, normalised names)."""
    lines = WHEELS_FILE.read_text().splitlines()
    return {normalize(line.split("==")[0].strip()) for line in lines if line.strip() and not line.startswith("#")}


def _importer_file() -> str:
    """File of the code that runs the import being looked up (the first frame outside importlib's
    frozen bootstrap, above the finder)."""
    frame = sys._getframe(1)
    while frame is not None and (frame.f_code.co_filename.startswith("<frozen")
                                 or frame.f_code.co_filename == __file__):
        frame = frame.f_back
    return frame.f_code.co_filename if frame is not None else ""


class _Blocker(importlib.abc.MetaPathFinder):
    def __init__(self, allowed: set[str], carried: set[str]) -> None:
        self.allowed = allowed
        self.distributions = importlib.metadata.packages_distributions()
        self.repo = HERE.parent
        self.carried_roots = self._carried_roots(carried)

    def _carried_roots(self, carried: set[str]) -> tuple[str, ...]:
        """Where the carried packages' top-level modules are installed here (package folders, or
        the files of single-module distributions)."""
        roots = []
        for module, dists in self.distributions.items():
            if module.isidentifier() and {normalize(d) for d in dists} & carried:
                spec = importlib.util.find_spec(module)
                if spec is not None and spec.submodule_search_locations:
                    roots.extend(spec.submodule_search_locations)
                elif spec is not None and spec.origin:
                    roots.append(spec.origin)
        return tuple(roots)

    def _checked(self) -> bool:
        """The import comes from the repository's code (not a virtual environment inside it) or
        from a carried package."""
        importer = Path(_importer_file())
        if str(importer).startswith(self.carried_roots):
            return True
        try:
            first = importer.relative_to(self.repo).parts[0]
        except ValueError:
            return False
        return not first.startswith(".venv")

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001 - the finder protocol
        if "." in fullname or fullname in sys.stdlib_module_names:
            return None
        dists = {normalize(d) for d in self.distributions.get(fullname, [])}
        if not dists or dists & self.allowed or not self._checked():
            return None
        raise ModuleNotFoundError(
            f"No module named {fullname!r} on the GPU machine (distribution {', '.join(sorted(dists))} is neither "
            "installed there nor carried in .whl/; add it to benchmarks/gpu_bundle_wheels.txt)", name=fullname)


def install() -> None:
    """Block the imports the GPU machine cannot do (see the module docstring); idempotent."""
    if any(isinstance(finder, _Blocker) for finder in sys.meta_path):
        return
    carried = carried_packages()
    sys.meta_path.insert(0, _Blocker(gpu_machine_packages() | carried | {"rlvr"}, carried))
