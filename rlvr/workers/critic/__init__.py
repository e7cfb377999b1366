"""The PPO critic (value function)."""

from rlvr.workers.critic.dp_critic import DataParallelPPOCritic

__all__ = ["DataParallelPPOCritic"]
