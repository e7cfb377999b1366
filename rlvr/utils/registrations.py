"""The names a process registered of its own, sent to the worker processes it starts.

A verl user's launcher registers code in the driver before it calls ``main()`` or ``run_ppo``:
``import my_ext`` (whose import registers an environment), or a class of the launcher script itself
(``__main__``) decorated with ``@register_environment("guess_number")``. The processes rlvr starts
(Ray worker actors, the process backend's children, the scoring pools) need those names too, without
the module being listed in ``trainer.user_modules``. :func:`user_code_for_workers` adds to what the
driver imported by its config (:func:`~rlvr.utils.user_code.current_user_code`) every entry of
rlvr's registries that does not come from rlvr itself:

- each pickled with cloudpickle, which sends a function or class of an importable module by
  reference (the worker imports the module, whose import registers it again) and one defined in
  ``__main__`` by value (the worker gets the code itself: the launcher script never runs again);
- with the folder each such module was imported from, and the launcher script's folder, added to
  the worker's ``sys.path``, so that a module the driver imported from its own folder imports there.

A worker adds what it receives (:func:`~rlvr.utils.user_code.import_user_code`) before it builds
anything. An entry that cannot be pickled in the driver is left out with a warning that names it; one
that cannot be loaded in a worker is noted on its registry, whose lookup of that name then says why
(so a worker fails on it only where the run uses the name).
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
import sys
import types
from pathlib import Path
from typing import Any

import cloudpickle

from rlvr.utils.registry import Registry, all_registries
from rlvr.utils.user_code import UserCode, current_user_code

__all__ = ["user_code_for_workers", "user_registrations"]

logger = logging.getLogger(__name__)


def _is_rlvr(module: str) -> bool:
    return module == "rlvr" or module.startswith("rlvr.")


def _home(registry: Registry) -> tuple[str, str] | None:
    """``(module, attribute)`` of an rlvr module that holds ``registry`` (None: a registry of the
    user's own, which their module makes again where it is imported)."""
    for name, module in list(sys.modules.items()):
        if _is_rlvr(name) and module is not None:
            for attribute, value in list(vars(module).items()):
                if value is registry:
                    return name, attribute
    return None


def _module_of(obj: Any) -> str:
    """The module that defines ``obj``: a function's or class's own, else its class's."""
    if isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType, types.MethodType)):
        return obj.__module__
    return type(obj).__module__


def _import_root(module_name: str) -> str | None:
    """The folder a worker needs on ``sys.path`` to import ``module_name`` as the driver did (the
    launcher script's folder for ``__main__``); None for a module without a file."""
    module = sys.modules.get(module_name)
    file = getattr(module, "__file__", None)  # namespace packages and built-in modules have none
    if not file:
        return None
    path = Path(file).resolve()
    if module_name == "__main__":
        return str(path.parent)
    depth = module_name.count(".") + (1 if path.name == "__init__.py" else 0)
    return str(path.parents[depth])


def user_registrations() -> tuple[list[tuple], list[str]]:
    """The entries of rlvr's registries that do not come from rlvr, and the folders their modules
    need: ``([(registry module, registry attribute, name, cloudpickled entry, metadata fields or
    None), ...], [folder, ...])``."""
    entries, folders = [], []
    for registry in all_registries():
        home = None
        for name, entry in list(registry.items()):
            module = _module_of(registry.identity_of(entry))
            if _is_rlvr(module):
                continue
            home = home or _home(registry)
            if home is None:
                break
            try:
                payload = cloudpickle.dumps(entry)
            except Exception as err:  # noqa: BLE001 - what cannot be sent is named, the rest goes
                logger.warning("the %s %r (from %s) cannot be sent to the worker processes (%s: %s); list its "
                               "module in trainer.user_modules so that they import it", registry.kind, name, module,
                               type(err).__name__, err)
                continue
            metadata = registry.registered_metadata(name)
            entries.append((*home, name, payload, dataclasses.asdict(metadata) if metadata is not None else None))
            root = _import_root(module)
            if root is not None:
                folders.append(root)
    return entries, list(dict.fromkeys(folders))


def user_code_for_workers() -> UserCode:
    """What a worker process imports and registers before it builds anything: the driver's
    :func:`~rlvr.utils.user_code.current_user_code` and :func:`user_registrations`."""
    code = current_user_code()
    entries, folders = user_registrations()
    return UserCode(code.modules, tuple(dict.fromkeys([*code.paths, *folders])),
                    pickle.dumps(entries) if entries else b"")
