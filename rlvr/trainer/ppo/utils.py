"""Small shared definitions of the PPO trainer."""

from __future__ import annotations

from enum import Enum


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
