"""The reward-manager registry (``reward_model.reward_manager`` in the config).

A registered class is built by :func:`rlvr.reward.reward_fn.load_reward_manager` through its
classmethod ``from_config(config, tokenizer, num_examine, compute_score, **reward_kwargs)``
and is then called as ``manager(data, return_dict=False)`` (see
:class:`~rlvr.reward.managers.base.AbstractRewardManager`).
"""

from __future__ import annotations

from collections.abc import Callable

from rlvr.utils.registry import Registry

REWARD_MANAGER_REGISTRY: Registry[type] = Registry("reward manager")


def register(name: str) -> Callable[[type], type]:
    """Class decorator adding a reward manager under ``name`` (a duplicate name raises)."""
    return REWARD_MANAGER_REGISTRY.register(name)


def get_reward_manager_cls(name: str) -> type:
    """The manager class registered as ``name``; an unknown name raises ``KeyError`` listing the valid ones."""
    return REWARD_MANAGER_REGISTRY.get(name)
