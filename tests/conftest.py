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

It also marks the slow variants of parametrized tests (``slow_on``) and keeps faulthandler on while
the interpreter shuts down.
"""

from __future__ import annotations

import faulthandler
import sys
from pathlib import Path

import pytest

from rlvr.utils import user_code
from rlvr.utils.registrations import _is_rlvr, _module_of, user_registrations
from rlvr.utils.registry import all_registries


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



@pytest.hookimpl(trylast=True)  # after pytest's own faulthandler plugin turned it off
def pytest_unconfigure(config: pytest.Config) -> None:
    """A crash while the interpreter shuts down (a native thread of torch, Ray or tokenizers still
    running) would print only "Segmentation fault"; with faulthandler on it names every thread's frames."""
    faulthandler.enable(file=sys.__stderr__, all_threads=True)

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
