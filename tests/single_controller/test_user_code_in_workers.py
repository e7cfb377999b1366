"""The user's modules reach the workers: a module the driver imported (``trainer.user_modules``)
is imported by every worker process before the worker is built, so what it registers (a rollout
engine, an agent loop, a tool) is there in the worker too: Ray actors and the process backend's
children (an asynchronous run's rollout on the local backend)."""

from __future__ import annotations

import sys

import pytest
from sc_workers import SEPARATE_PROCESS_BACKENDS, DemoWorker

from rlvr.single_controller import ClassWithInitArgs
from rlvr.utils import user_code
from rlvr.utils.user_code import import_user_modules


@pytest.fixture
def users_module(tmp_path, monkeypatch):
    """A module of the user's, in a folder outside the project, imported by the driver (from its
    file, as ``trainer.user_modules=[/path/sc_users_ext.py]`` does); removed again afterwards."""
    monkeypatch.setattr(user_code, "_imported", {})
    monkeypatch.setattr(user_code, "_paths", {})
    monkeypatch.setattr(sys, "path", list(sys.path))
    source = tmp_path / "users_project" / "sc_users_ext.py"
    source.parent.mkdir()
    source.write_text("VALUE = 'imported in ' + __name__\n")
    [module] = import_user_modules([str(source)])
    yield module.__name__
    sys.modules.pop(module.__name__, None)


@pytest.mark.slow
@pytest.mark.parametrize("backend", SEPARATE_PROCESS_BACKENDS)
def test_every_worker_process_imports_the_users_modules_of_the_driver(backend, make_group, users_module):
    assert users_module == "sc_users_ext"
    group = make_group(backend, ClassWithInitArgs(DemoWorker), name_prefix=f"users_{backend}", call_timeout_s=60)
    assert group.module_value(users_module) == ["imported in sc_users_ext"] * 2
    assert group.module_value("sc_not_imported_anywhere") == [None, None]
