"""Model workers (seed 001): the hybrid actor/rollout/reference worker, the critic and reference
training workers, and their parts.

- ``rlvr.workers.engine_workers``: ``ActorRolloutRefWorker``, ``TrainingWorker``, ``CriticWorker``.
- ``rlvr.workers.actor.dp_actor``: ``DataParallelPPOActor`` (log-probs, policy update).
- ``rlvr.workers.critic.dp_critic``: ``DataParallelPPOCritic`` (values, value update).
- ``rlvr.workers.rollout``: the rollout-engine protocol and registry, ``HFRollout`` (``"hf"``).
- ``rlvr.workers.models``, ``rlvr.workers.fsdp``, ``rlvr.workers.checkpoint``,
  ``rlvr.workers.batching``: model building, FSDP2 sharding and optimizers, checkpoints, batching.
- ``rlvr.workers.reward_manager`` and ``rlvr.workers.reward``: reward computation.

Import from the submodules; this package module stays light so that importing the reward parts
does not load the model stack.
"""
