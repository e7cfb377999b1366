"""A user scoring function loaded from a Python file (``custom_reward_function.path`` / ``.name``).

:class:`CustomRewardFunction` is a picklable callable: it pickles as ``(path, name)`` and loads
the file on first use in whichever process calls it, so it works in the parallel reward
manager's worker processes and on Ray workers alike.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr.utils.errors import ConfigError
from rlvr.utils.user_code import load_file

_LOADED: dict[tuple[str, str], Callable[..., Any]] = {}


def load_function(path: str, name: str) -> Callable[..., Any]:
    """The callable ``name`` of the Python file ``path`` (cached per process). A module already
    imported from that file (``trainer.user_modules``, or the user's own ``import``) is reused,
    so a file that also registers extensions runs once; another file is imported under a name of
    its own (:func:`rlvr.utils.user_code.load_file`).

    Raises:
        ConfigError: the file is missing, fails to import, or has no callable ``name``.
    """
    key = (str(Path(path).resolve()), name)
    if key in _LOADED:
        return _LOADED[key]
    if not Path(key[0]).is_file():
        raise ConfigError("custom_reward_function.path", f"file {path!r} does not exist; give the path of a .py file")
    try:
        module = load_file(key[0])
    except Exception as exc:
        raise ConfigError(
            "custom_reward_function.path", f"importing {path!r} failed with {type(exc).__name__}: {exc}"
        ) from exc
    fn = getattr(module, name, None)
    if not callable(fn):
        available = sorted(n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_"))
        raise ConfigError(
            "custom_reward_function.name",
            f"{path!r} has no function {name!r}; functions defined there: {', '.join(available) or 'none'}",
        )
    _LOADED[key] = fn
    return fn


@dataclass(frozen=True)
class CustomRewardFunction:
    """``fn(data_source, solution_str, ground_truth, extra_info=None, **kwargs)`` read from a file.

    Attributes:
        path: the Python file.
        name: the function inside it.
        kwargs: extra keyword arguments passed on every call.
    """

    path: str
    name: str
    kwargs: dict = field(default_factory=dict)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return load_function(self.path, self.name)(*args, **self.kwargs, **kwargs)
