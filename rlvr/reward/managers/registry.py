"""The reward-manager registry (``reward_model.reward_manager`` in the config).

A registered class is built by :func:`rlvr.reward.reward_fn.load_reward_manager` through its
classmethod ``from_config(config, tokenizer, num_examine, compute_score, **reward_kwargs)``
and is then called as ``manager(data, return_dict=False)`` (see
:class:`~rlvr.reward.managers.base.AbstractRewardManager`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlvr.reward.managers.base import RewardManagerBase
from rlvr.utils.registry import Registry


def _manager_class(obj: Any) -> type:
    """An object loaded by path (``pkg.module:Class``) as a reward manager: a subclass of
    :class:`~rlvr.reward.managers.base.RewardManagerBase` (which gives ``from_config``)."""
    if not (isinstance(obj, type) and issubclass(obj, RewardManagerBase)):
        raise TypeError(f"{obj!r} is not a subclass of RewardManagerBase")
    return obj


REWARD_MANAGER_REGISTRY: Registry[type] = Registry("reward manager", coerce=_manager_class)


def register(name: str) -> Callable[[type], type]:
    """Class decorator adding a reward manager under ``name`` (another class under a taken name
    raises ``ValueError``; the same class again, or one with its module and qualified name, is
    accepted)."""
    return REWARD_MANAGER_REGISTRY.register(name)


def get_reward_manager_cls(name: str) -> type:
    """The manager class registered as ``name`` (or at the object path ``pkg.module:Class``); an
    unknown name raises a ``KeyError`` that is also verl's ``ValueError`` ("Unknown reward manager:
    <name>"), listing the valid ones."""
    return REWARD_MANAGER_REGISTRY.get(name)
