"""Reward managers (``reward_model.reward_manager``): ``naive``, ``dapo``, ``batch``, ``parallel``.

Add one with ``@register("name")`` on a class that implements ``from_config`` and
``__call__(data, return_dict=False)`` (see :mod:`.registry` and :mod:`.base`).
"""

from rlvr.workers.reward_manager.base import AbstractRewardManager
from rlvr.workers.reward_manager.batch import BatchRewardManager
from rlvr.workers.reward_manager.dapo import DAPORewardManager
from rlvr.workers.reward_manager.naive import NaiveRewardManager
from rlvr.workers.reward_manager.parallel import ParallelRewardManager
from rlvr.workers.reward_manager.registry import REWARD_MANAGER_REGISTRY, get_reward_manager_cls, register
from rlvr.workers.reward_manager.router import RewardRouter

__all__ = [
    "AbstractRewardManager",
    "BatchRewardManager",
    "DAPORewardManager",
    "NaiveRewardManager",
    "ParallelRewardManager",
    "REWARD_MANAGER_REGISTRY",
    "RewardRouter",
    "get_reward_manager_cls",
    "register",
]
