"""The reward managers at verl's module path; they live in :mod:`rlvr.reward.managers` (see
:mod:`rlvr.reward.legacy_paths`)."""

import sys

from rlvr.reward.legacy_paths import alias_submodules
from rlvr.reward.managers import (
    REWARD_MANAGER_REGISTRY,
    AbstractRewardManager,
    BatchRewardManager,
    DAPORewardManager,
    NaiveRewardManager,
    ParallelRewardManager,
    RewardManagerBase,
    get_reward_manager_cls,
    register,
)
from rlvr.reward.router import RewardRouter

_MANAGER_MODULES = ("base", "batch", "dapo", "naive", "parallel", "registry")
alias_submodules(sys.modules[__name__], {
    **{name: f"rlvr.reward.managers.{name}" for name in _MANAGER_MODULES},
    "abstract": "rlvr.reward.managers.base",  # verl's module of AbstractRewardManager
    "router": "rlvr.reward.router",
    "contract": "rlvr.reward.contract",
})

__all__ = [
    "AbstractRewardManager",
    "BatchRewardManager",
    "DAPORewardManager",
    "NaiveRewardManager",
    "ParallelRewardManager",
    "REWARD_MANAGER_REGISTRY",
    "RewardManagerBase",
    "RewardRouter",
    "get_reward_manager_cls",
    "register",
]
