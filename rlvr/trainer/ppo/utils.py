"""Small shared definitions of the PPO trainer (verl's ``verl.trainer.ppo.utils``)."""

from __future__ import annotations

from enum import Enum
from typing import Any


class Role(Enum):
    """The roles a worker group can play; the trainer maps each role to a worker class and a pool."""

    Actor = 0
    Rollout = 1
    ActorRollout = 2
    Critic = 3
    RefPolicy = 4
    RewardModel = 5
    ActorRolloutRef = 6
    TeacherModel = 7


def need_reward_model(config: Any) -> bool:
    """verl's ``need_reward_model(config)``: whether the run scores with the discriminative reward model.

    Reads ``config.reward.reward_model.enable`` as verl does (a full rlvr config, or verl's config
    or an OmegaConf node holding only that section); ``None`` (unset) is ``False``. rlvr's legacy
    ``reward_model.enable`` reaches this key when the config loads.
    """
    from rlvr.trainer.config.validate_models import uses_reward_model  # here: keeps this module light

    return uses_reward_model(config)
