"""Suite-wide hygiene of rlvr's registries.

Every process rlvr starts (Ray workers, the process backend's children, the scoring pools) imports
what the driver registered that is not rlvr's own (:mod:`rlvr.utils.registrations`). In a test run
the driver is pytest: an entry a test module leaves behind makes every later worker of the whole suite
import that test module and whatever it imports (a stand-in server backend left at import cost each
worker of the suite the server engine's and torch's imports, seconds per process). So:

- after collection no test module may have registered anything at import (register in a fixture);
- what a test module registers is taken out again when its last test ends, with the user modules it
  imported (``trainer.user_modules``): the module that registered an entry is dropped from
  ``sys.modules``, so a later test that names it imports it again and gets its entries back.

It also marks the slow variants of parametrized tests (``slow_on``) and ends pytest's process without
the interpreter's teardown once the results are final (see :func:`pytest_unconfigure`).
"""

from __future__ import annotations

import atexit
import faulthandler
import os
import sys
from pathlib import Path

import pytest

from rlvr.utils import user_code
from rlvr.utils.registrations import _is_rlvr, _module_of, user_registrations
from rlvr.utils.registry import all_registries

_EXIT_STATUS = pytest.StashKey[int]()


def pytest_collection_finish(session: pytest.Session) -> None:
    entries, _ = user_registrations()
    if entries:
        names = ", ".join(f"{module}.{table}[{name!r}]" for module, table, name, _, _ in entries)
        raise pytest.UsageError(f"test modules registered {names} when imported; register in a fixture "
                                "instead, so that the suite's worker processes do not import them")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by the markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """``@pytest.mark.slow_on("ray", ...)``: only the parametrized variants with one of these values
    are slow (e.g. a Ray group starts in seconds, the in-process one at once)."""
    for item in items:
        values = [value for value in getattr(getattr(item, "callspec", None), "params", {}).values()
                  if isinstance(value, str)]
        if any(value in mark.args for mark in item.iter_markers("slow_on") for value in values):
            item.add_marker(pytest.mark.slow)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config.stash[_EXIT_STATUS] = int(exitstatus)


@pytest.hookimpl(trylast=True)  # after every other plugin, pytest's faulthandler plugin included
def pytest_unconfigure(config: pytest.Config) -> None:
    """End pytest's own process once the results are final: the atexit functions run (Ray's
    shutdown, rlvr's helper pools), then the process exits with pytest's status without the
    interpreter's teardown. That teardown is where native threads of torch, Ray or tokenizers crashed
    CI's default suite after 2,053 passed ("Segmentation fault", exit 139). faulthandler stays on for
    the atexit functions, so a crash there names every thread's frames. xdist's workers end through
    their own channel and are left alone (a crash there cannot change the results either)."""
    faulthandler.enable(file=sys.__stderr__, all_threads=True)
    if hasattr(config, "workerinput") or _EXIT_STATUS not in config.stash:
        return
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        stream.flush()
    os._exit(config.stash[_EXIT_STATUS])


@pytest.fixture(autouse=True, scope="module")
def registrations_stay_in_their_module():
    """Every registry, and the user code this process imported, as before the module's first test,
    again after its last one."""
    saved = [(registry, dict(registry), dict(registry._metadata), dict(registry._unloadable))
             for registry in all_registries()]
    imported, paths = dict(user_code._imported), dict(user_code._paths)
    yield
    for registry, entries, metadata, unloadable in saved:
        for name, entry in registry.items():
            if entries.get(name) is not entry:
                _forget_module_of(registry.identity_of(entry))
        registry.clear()
        registry.update(entries)
        registry._metadata, registry._unloadable = metadata, unloadable
    for table, before in ((user_code._imported, imported), (user_code._paths, paths)):
        table.clear()
        table.update(before)


def _forget_module_of(obj) -> None:
    """Drop the user module that defines ``obj`` from ``sys.modules``, so that importing it again
    registers it again: not rlvr's, not a test module (pytest imported it once), not one of the
    interpreter's or the venv's (a ``functools.partial`` entry must not take ``functools`` along)."""
    name = _module_of(obj)
    if not name or name == "__main__" or _is_rlvr(name) or name.startswith("test_"):
        return
    file = getattr(sys.modules.get(name), "__file__", None)
    installed = {Path(prefix).resolve() for prefix in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    if file is None or any(Path(file).resolve().is_relative_to(prefix) for prefix in installed):
        return
    sys.modules.pop(name, None)
