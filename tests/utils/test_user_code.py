"""rlvr.utils.user_code: the user's modules (names and ``.py`` files) imported and recorded for the
worker processes, files imported once, object paths, and another process importing the same code
from the environment the driver gives it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rlvr.utils import user_code
from rlvr.utils.user_code import (
    USER_CODE_ENV,
    UserCode,
    UserCodeError,
    current_user_code,
    import_user_code,
    import_user_modules,
    is_object_path,
    load_file,
    load_object,
)


@pytest.fixture
def clean(monkeypatch):
    """A fresh record of imported user code, and the test's own modules removed afterwards."""
    monkeypatch.setattr(user_code, "_imported", {})
    monkeypatch.setattr(user_code, "_paths", {})
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        del sys.modules[name]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def test_a_module_name_is_found_from_the_working_directory(clean, tmp_path, monkeypatch):
    write(tmp_path / "proj" / "ucext_one.py", "VALUE = 1\n")
    monkeypatch.chdir(tmp_path / "proj")
    [module] = import_user_modules("ucext_one")
    assert module.VALUE == 1 and sys.path[-1] == str(tmp_path / "proj")  # appended: it shadows no package
    assert current_user_code() == UserCode(("ucext_one",), (str(tmp_path / "proj"),))


def test_a_file_is_imported_as_its_own_module_once(clean, tmp_path, monkeypatch):
    ext = write(tmp_path / "lib" / "ucext_two.py", "import itertools\nCOUNT = next(itertools.count())\n")
    monkeypatch.chdir(tmp_path)
    [module] = import_user_modules(["lib/ucext_two.py"])
    assert module.__name__ == "ucext_two" and sys.modules["ucext_two"] is module
    assert import_user_modules([str(ext)]) == [module]  # the same file again: the same module
    assert load_file(ext) is module  # custom_reward_function.path of that file: reused, not run again
    assert current_user_code() == UserCode((str(ext),), (str(ext.parent),))


def test_a_file_whose_name_is_taken_gets_a_name_of_its_own(clean, tmp_path):
    ext = write(tmp_path / "json.py", "MINE = True\n")
    [module] = import_user_modules([str(ext)])
    assert module.MINE and module.__name__.startswith("rlvr_file_json_") and sys.modules["json"] is json
    assert import_user_modules([str(ext)]) == [module]
    again = load_file(ext)
    assert again is module and module.__name__ == user_code._fallback_name(ext.resolve())  # the same in any process


def test_a_file_already_imported_from_a_package_keeps_its_package_name(clean, tmp_path, monkeypatch):
    write(tmp_path / "ucpkg" / "__init__.py", "")
    ext = write(tmp_path / "ucpkg" / "ext.py", "X = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import ucpkg.ext  # noqa: F401 - the user's own import

    [module] = import_user_modules([str(ext)])
    assert module is sys.modules["ucpkg.ext"]
    # another process imports it under the same name, from the package's folder
    assert current_user_code() == UserCode(("ucpkg.ext",), (str(tmp_path),))


def test_errors_name_the_module_and_the_reason(clean, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserCodeError, match=rf"importing 'nope_module' failed: No module named 'nope_module' "
                                            rf"\(looked in the installed packages and the folders \['{tmp_path}'\]"):
        import_user_modules(["nope_module"])
    write(tmp_path / "broken_ext.py", "raise RuntimeError('boom')\n")
    with pytest.raises(UserCodeError, match="importing 'broken_ext.py' failed: RuntimeError: boom"):
        import_user_modules(["broken_ext.py"])
    with pytest.raises(UserCodeError, match=f"file '{tmp_path / 'missing.py'}' does not exist"):
        import_user_modules(["missing.py"])
    assert current_user_code() == UserCode()  # nothing recorded for a failed import, no folder either


def test_object_paths(clean, tmp_path, monkeypatch):
    write(tmp_path / "ucext_three.py", "class Outer:\n    class Inner:\n        pass\ndef fn():\n    return 3\n")
    monkeypatch.chdir(tmp_path)
    assert load_object("ucext_three:fn")() == 3
    assert load_object("ucext_three:Outer.Inner").__qualname__ == "Outer.Inner"
    assert load_object(f"{tmp_path / 'ucext_three.py'}:fn") is load_object("ucext_three:fn")
    assert load_object("os.path:join") is os.path.join
    with pytest.raises(UserCodeError, match="'ucext_three' has no 'gone'; it defines: Outer, fn"):
        load_object("ucext_three:gone")
    assert [is_object_path(s) for s in ("a.b:C", "f.py:C", "grpo", "a:", ":b", None)] == [True, True, False,
                                                                                            False, False, False]


def test_the_environment_for_a_worker_and_back(clean, tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/already/there")
    code = UserCode(("pkg.ext", "/abs/ext.py"), ("/proj",))
    env = code.to_env()
    assert json.loads(env[USER_CODE_ENV]) == {"modules": ["pkg.ext", "/abs/ext.py"], "paths": ["/proj"]}
    assert env["PYTHONPATH"] == os.pathsep.join(["/already/there", "/proj"])
    assert UserCode().to_env() == {}


REGISTERING_MODULE = """
from rlvr.agent import register_environment

@register_environment("uc_probe_env")
class ProbeEnv:
    def reset(self, row):
        return None

    def step(self, text):
        return "", 0.0, True, {}
"""

WORKER_PROCESS = """
import os, sys
from rlvr.agent import ENVIRONMENTS
from rlvr.single_controller.base.worker import Worker
assert "uc_probe_env" not in ENVIRONMENTS
Worker()  # a worker process imports the driver's user code before it builds anything
print(ENVIRONMENTS["uc_probe_env"].__module__, ENVIRONMENTS["uc_probe_env"].__qualname__)
"""


def test_a_worker_process_imports_the_code_its_driver_imported(clean, tmp_path, monkeypatch):
    """What a Ray actor gets: the driver's record in its environment; ``Worker.__init__`` imports it
    (here in a fresh interpreter started elsewhere, without the project on its path)."""
    from rlvr.agent.env_agent import ENVIRONMENTS

    write(tmp_path / "proj" / "uc_probe.py", REGISTERING_MODULE)
    monkeypatch.chdir(tmp_path / "proj")
    try:
        import_user_modules(["uc_probe"])
    finally:
        ENVIRONMENTS.pop("uc_probe_env", None)  # registered in this process too: gone after the import
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(current_user_code().to_env())
    result = subprocess.run([sys.executable, "-c", WORKER_PROCESS], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["uc_probe", "ProbeEnv"]


def test_import_user_code_skips_what_is_imported_already(clean, tmp_path, monkeypatch):
    write(tmp_path / "ucext_four.py", "import random\nTOKEN = random.random()\n")
    monkeypatch.chdir(tmp_path)
    [module] = import_user_modules(["ucext_four"])
    import_user_code(UserCode(("ucext_four",), (str(tmp_path),)))
    assert sys.modules["ucext_four"] is module
