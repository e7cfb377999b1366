"""Reward managers (``reward_model.reward_manager``): ``naive``, ``dapo``, ``batch``, ``parallel``.

Add one with ``@register("name")`` on a class that takes the shared constructor of
:class:`~rlvr.reward.managers.base.RewardManagerBase` and implements ``from_config`` and
``__call__(data, return_dict=False)`` (subclassing the base gives both).
"""

from rlvr.reward.managers.base import AbstractRewardManager, RewardManagerBase
from rlvr.reward.managers.batch import BatchRewardManager
from rlvr.reward.managers.dapo import DAPORewardManager
from rlvr.reward.managers.naive import NaiveRewardManager
from rlvr.reward.managers.parallel import ParallelRewardManager
from rlvr.reward.managers.registry import REWARD_MANAGER_REGISTRY, get_reward_manager_cls, register

__all__ = [
    "AbstractRewardManager",
    "BatchRewardManager",
    "DAPORewardManager",
    "NaiveRewardManager",
    "ParallelRewardManager",
    "REWARD_MANAGER_REGISTRY",
    "RewardManagerBase",
    "get_reward_manager_cls",
    "register",
]
