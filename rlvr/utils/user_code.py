"""Users' own code: the modules a run imports in every process, and ``pkg.module:Name`` paths.

A run lists the user's modules in ``trainer.user_modules`` (rlvr's key, for every registry) and, as
verl does, in ``actor_rollout_ref.model.external_lib`` / ``critic.model.external_lib``. An entry is
a module name (``my_project.extensions``) or a Python file (``extensions.py``, ``/abs/ext.py``):

- a module name is imported as ``python -m`` would from the directory the command runs in: that
  directory is appended to ``sys.path`` (after the installed packages, so it shadows none);
- a file is imported as the top-level module named after it, its folder appended to ``sys.path``;
  a module already imported from that file is reused (so a file that is both a scorer,
  ``custom_reward_function.path``, and a list of registrations runs once). When the file's name is
  taken by another module (``math.py``), it is loaded under ``rlvr_file_<name>_<hash>``. A worker
  process, which gets the file's folder on its path first, finds the file itself under its name
  and keeps that name, so a class defined there pickles between the processes.

:func:`import_user_modules` records what a process imported (:func:`current_user_code`). Every
process rlvr starts gets that record and imports the same modules before it builds anything: Ray
worker actors through their environment (:func:`UserCode.to_env`, read back by
:func:`import_user_code_from_env` in ``Worker.__init__``), the processes of the scoring pools as an
argument (:func:`import_user_code`), the process backend's children (an asynchronous run's rollout
on the local backend) through their environment as well. A worker on the local backend is the driver
process itself. The record the workers get also holds every name the driver registered of its own
in some other way (a launcher script that imports its extensions or defines them itself), pickled:
:func:`rlvr.utils.registrations.user_code_for_workers`; :func:`import_user_code` registers those last.

Wherever a registry name goes, ``pkg.module:Name`` (or ``path/to/file.py:Name``) names an object
directly; :func:`load_object` imports it on demand, in whichever process needs it.
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import importlib.util
import json
import os
import pickle
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = [
    "USER_CODE_ENV",
    "UserCode",
    "UserCodeError",
    "absolute_spec",
    "current_user_code",
    "import_user_code",
    "import_user_code_from_env",
    "import_user_modules",
    "is_object_path",
    "load_file",
    "load_object",
]

USER_CODE_ENV = "RLVR_USER_CODE"
"""Environment variable that carries a :class:`UserCode` (JSON) to a worker process."""

MAX_ENV_REGISTRATIONS = 96 * 1024
"""Largest base64 text of :attr:`UserCode.registrations` sent in an environment variable (Linux
limits one variable to 128 KiB)."""


class UserCodeError(ImportError):
    """A user module or object could not be imported; the message says which and why."""


@dataclass(frozen=True)
class UserCode:
    """What a process imported of the user's code.

    Attributes:
        modules: module names and absolute ``.py`` paths, in import order.
        paths: absolute folders appended to ``sys.path`` (the driver's working directory, the
            folders of the files).
        registrations: registry entries to add after the modules are imported, pickled
            (:func:`rlvr.utils.registrations.user_code_for_workers`); empty: none.
    """

    modules: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()
    registrations: bytes = b""

    def to_env(self) -> dict[str, str]:
        """Environment variables that give a worker process this code: ``RLVR_USER_CODE`` and a
        ``PYTHONPATH`` that ends with :attr:`paths` (so that Ray can import a user class before the
        worker's constructor runs). Empty when there is nothing to pass.

        Raises:
            UserCodeError: the registrations are too large for an environment variable.
        """
        if not self.modules and not self.paths and not self.registrations:
            return {}
        existing = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        pythonpath = os.pathsep.join(dict.fromkeys([*existing, *self.paths]))
        record: dict[str, Any] = {"modules": list(self.modules), "paths": list(self.paths)}
        if self.registrations:
            record["registrations"] = base64.b64encode(self.registrations).decode("ascii")
            if len(record["registrations"]) > MAX_ENV_REGISTRATIONS:
                raise UserCodeError(
                    f"the names this process registered of its own take {len(record['registrations']) // 1024} KiB "
                    f"pickled, more than a worker's environment carries ({MAX_ENV_REGISTRATIONS // 1024} KiB); put "
                    "their code in a module and list it in trainer.user_modules")
        return {USER_CODE_ENV: json.dumps(record), "PYTHONPATH": pythonpath}


_imported: dict[str, None] = {}  # ordered set of the specs this process imported
_paths: dict[str, None] = {}  # ordered set of the folders this process appended for user code


def current_user_code() -> UserCode:
    """What this process imported of the user's code (pass it on to the processes it starts)."""
    return UserCode(tuple(_imported), tuple(_paths))


def is_object_path(name: Any) -> bool:
    """Whether ``name`` is an object path ``pkg.module:Name`` / ``file.py:Name`` (not a registry name)."""
    return isinstance(name, str) and ":" in name and not name.startswith(":") and not name.endswith(":")


def _is_file(spec: str) -> bool:
    return spec.endswith(".py") or os.sep in spec or "/" in spec


def absolute_spec(spec: str) -> str:
    """A user-module entry with a file made absolute (module names unchanged)."""
    return str(Path(spec).resolve()) if _is_file(spec) else spec


def _append_path(folder: str) -> str:
    """Append ``folder`` to ``sys.path`` (unless there already); returns it as an absolute path.
    :func:`_record_path` records it for the worker processes once an import from it worked."""
    folder = os.path.abspath(folder)
    if folder not in sys.path:
        sys.path.append(folder)
    return folder


def _record_path(folder: str) -> None:
    _paths[folder] = None


def _loaded_from(path: Path) -> ModuleType | None:
    """The module already imported from the file ``path``, if any."""
    for module in list(sys.modules.values()):
        origin = getattr(module, "__file__", None)  # builtin and namespace modules have no file
        if origin and os.path.basename(origin) == path.name and Path(origin).resolve() == path:
            return module
    return None


def _exec_file(path: Path, name: str) -> ModuleType:
    """Import the file ``path`` as the module ``name`` (registered in ``sys.modules``)."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UserCodeError(f"{path} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _fallback_name(path: Path) -> str:
    """A module name for a file whose own name is taken, the same in every process."""
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    stem = "".join(c if c.isalnum() else "_" for c in path.stem)
    return f"rlvr_file_{stem}_{digest}"


def load_file(path: str | os.PathLike) -> ModuleType:
    """The module of the Python file ``path``: the one already imported from it, else the file
    imported under a name of its own (``sys.path`` is left as it is). Used for
    ``custom_reward_function.path``.

    Raises:
        UserCodeError: the file does not exist.
        Exception: whatever importing the file raises.
    """
    file = Path(path).resolve()
    if not file.is_file():
        raise UserCodeError(f"file {str(path)!r} does not exist")
    return _loaded_from(file) or _exec_file(file, _fallback_name(file))


def _free_or_this_file(name: str, path: Path) -> bool:
    """Whether importing ``name`` finds nothing, or finds the file ``path`` itself (a worker process
    gets the file's folder on ``sys.path`` before it imports the file: it keeps the driver's name)."""
    found = importlib.util.find_spec(name)
    return found is None or (found.origin is not None and Path(found.origin).resolve() == path)


def _import_file(path: Path) -> ModuleType:
    """A user file as a top-level module named after it (see the module docstring)."""
    loaded = _loaded_from(path)
    if loaded is not None:
        return loaded
    if not path.is_file():
        raise UserCodeError(f"file {str(path)!r} does not exist")
    name = path.stem
    if name.isidentifier() and name not in sys.modules and _free_or_this_file(name, path):
        folder = _append_path(str(path.parent))
        module = importlib.import_module(name)
        _record_path(folder)
        return module
    return _exec_file(path, _fallback_name(path))


def _import_one(spec: str) -> ModuleType:
    if _is_file(spec):
        return _import_file(Path(spec).resolve())
    folder = _append_path(os.getcwd())
    module = importlib.import_module(spec)
    _record_path(folder)
    return module


def _describe(error: BaseException) -> str:
    if isinstance(error, ModuleNotFoundError):
        return (f"{error} (looked in the installed packages and the folders {list(_paths) or [os.getcwd()]}; "
                "run from the project folder, or give a .py file)")
    return f"{type(error).__name__}: {error}"


def import_user_modules(specs: Any) -> list[ModuleType]:
    """Import the user's modules ``specs`` (a name, a ``.py`` path or a list of them; None: none)
    in order and record them for the worker processes (:func:`current_user_code`).

    Raises:
        UserCodeError: a module is missing or fails to import (the message names it and says why).
    """
    if specs is None:
        return []
    modules = []
    for spec in [specs] if isinstance(specs, str) else list(specs):
        spec = str(spec)
        resolved = absolute_spec(spec)
        try:
            module = _import_one(resolved)
        except UserCodeError:
            raise
        except Exception as err:
            raise UserCodeError(f"importing {spec!r} failed: {_describe(err)}") from err
        _imported[_how_to_import(resolved, module)] = None
        modules.append(module)
    return modules


def _how_to_import(spec: str, module: ModuleType) -> str:
    """How another process imports ``module`` again: ``spec``, or, for a file that this process had
    imported as a module of a package (``pkg.ext`` from ``/proj/pkg/ext.py``), that module's name
    with the package's folder (``/proj``) recorded, so both processes give it the same name."""
    if not _is_file(spec) or "." not in module.__name__ or module.__name__.startswith("rlvr_file_"):
        return spec
    _record_path(_append_path(str(Path(spec).parents[module.__name__.count(".")])))
    return module.__name__


def import_user_code(code: UserCode) -> None:
    """Import ``code`` (from another process) here: append its folders to ``sys.path``, import
    its modules, then add its registrations. Modules imported already are not imported again."""
    for folder in code.paths:
        _record_path(_append_path(folder))
    import_user_modules([spec for spec in code.modules if spec not in _imported])
    if code.registrations:
        _register_shipped(code.registrations)


def _register_shipped(registrations: bytes) -> None:
    """Add the entries of another process (see :class:`UserCode`): ``(registry module, registry
    attribute, name, pickled entry, metadata fields or None)`` each. A name already registered here
    (its module's import registered it) is kept; an entry that cannot be unpickled here is noted
    on its registry, whose lookup of the name then says why."""
    for module, attribute, name, payload, metadata in pickle.loads(registrations):
        registry = vars(importlib.import_module(module))[attribute]
        if name in registry:
            continue
        try:
            entry = pickle.loads(payload)  # imports the module of an entry sent by reference
        except Exception as err:  # noqa: BLE001 - any failure to load is reported at the lookup
            registry.note_unloadable(name, f"{type(err).__name__}: {err} (make its module importable here, e.g. "
                                           "list it in trainer.user_modules)")
            continue
        if name not in registry:
            registry.add(name, entry, **(metadata or {}))


def import_user_code_from_env() -> None:
    """In a worker process: import the user code the driver passed in ``RLVR_USER_CODE`` (no-op
    without it). Called by ``Worker.__init__`` before a worker builds anything."""
    raw = os.environ.get(USER_CODE_ENV)
    if not raw:
        return
    data = json.loads(raw)
    import_user_code(UserCode(tuple(data.get("modules", ())), tuple(data.get("paths", ())),
                              base64.b64decode(data.get("registrations", ""))))


def load_object(path: str) -> Any:
    """The object named by ``pkg.module:Name`` or ``path/to/file.py:Name`` (``Name`` may be dotted,
    ``Outer.Inner``), importing its module on demand (as :func:`import_user_modules` does).

    Raises:
        UserCodeError: not an object path, the module does not import, or it has no such name.
    """
    if not is_object_path(path):
        raise UserCodeError(f"{path!r} is not an object path; write it as pkg.module:Name or file.py:Name")
    module_spec, _, attribute = path.rpartition(":")
    try:
        module = _import_one(absolute_spec(module_spec))
    except UserCodeError:
        raise
    except Exception as err:
        raise UserCodeError(f"importing {module_spec!r} for {path!r} failed: {_describe(err)}") from err
    obj: Any = module
    for part in attribute.split("."):
        if part not in vars(obj):
            public = sorted(n for n in vars(module) if not n.startswith("_"))
            raise UserCodeError(f"{module_spec!r} has no {attribute!r}; it defines: {', '.join(public) or 'nothing'}")
        obj = vars(obj)[part]
    return obj
