"""The PPO actor (policy log-probs and updates)."""

from rlvr.workers.actor.dp_actor import DataParallelPPOActor

__all__ = ["DataParallelPPOActor"]
