"""Model workers: the actor/rollout/reference worker, the critic worker, and their parts.

- ``rlvr.workers.engine_workers``: ``TrainingWorker`` (the shared base), ``ActorRolloutRefWorker``
  (actor, rollout and/or reference by role), ``CriticWorker``.
- ``rlvr.workers.actor.dp_actor``: ``DataParallelPPOActor`` (log-probs, the policy loss).
- ``rlvr.workers.critic.dp_critic``: ``DataParallelPPOCritic`` (values, the value loss).
- ``rlvr.workers.ppo_update``: the update loop both train with (epochs, mini-batches, gradient
  accumulation, the optimizer step).
- ``rlvr.workers.rollout``: the rollout-engine protocol and registry, ``HFRollout`` (``"hf"``).
- ``rlvr.workers.megatron``: the Megatron-LM backend (``strategy=megatron``), the same worker
  methods on megatron-core models (``docs/megatron.md``).
- ``rlvr.workers.models`` (building models), ``fsdp`` (FSDP2 sharding, full weights, offload),
  ``optimizer`` (AdamW, lr schedule), ``checkpoint``, ``batching`` (micro-batches, rows that share a
  prompt), ``kv_cache`` (KV-cache row selection), ``collectives`` (all-reduce helpers),
  ``worker_utils`` (threads, timing, placement).

Reward computation (managers, reward workers, scorers, routing) lives in :mod:`rlvr.reward`.
Import from the submodules; this package module stays light.
"""
