"""The module paths reward code is also known by, so that code written for them keeps working.

The reward code lives in :mod:`rlvr.reward`; its public API is also importable from verl's module
paths with ``verl`` -> ``rlvr``: ``rlvr.utils.reward_score`` (scorers), ``rlvr.workers.reward_manager``
(managers), ``rlvr.workers.reward`` (reward workers) and ``rlvr.trainer.ppo.reward``
(``compute_reward``, ``load_reward_manager``). Those packages are thin: they re-export the names and
alias their submodules (``import rlvr.utils.reward_score.gsm8k`` gives ``rlvr.reward.scorers.gsm8k``,
the same module object, so registries and patched attributes are shared).
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType


def alias_submodules(package: ModuleType, targets: dict[str, str]) -> None:
    """Make ``<package>.<name>`` the module ``targets[name]`` for every name (imported now)."""
    for name, target in targets.items():
        module = importlib.import_module(target)
        sys.modules[f"{package.__name__}.{name}"] = module
        setattr(package, name, module)
