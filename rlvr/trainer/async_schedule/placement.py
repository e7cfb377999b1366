"""Where a rollout apart from the actor runs (``actor_rollout_ref.hybrid_engine=false``).

On Ray the rollout workers get a resource pool of their own, ``rollout_pool``, sized by the
top-level ``rollout`` section (``nnodes`` x ``n_gpus_per_node``, verl's keys), next to the trainer's
``global_pool``: on a cluster they may run on other nodes than the actor. On the local backend the
actor stays in the driver and the rollout runs in one child process (the ``process`` backend), so
the two compute at the same time on a CPU. Either way the rollout group's workers run two calls at
once (a generation and a weight push, see :mod:`rlvr.workers.rollout.partial`).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import torch
from omegaconf import DictConfig

from rlvr.single_controller import ClassWithInitArgs, WorkerGroup, get_worker_group_cls
from rlvr.trainer.ppo.utils import Role

__all__ = ["ROLLOUT_POOL", "ROLLOUT_GROUP", "rollout_pool_spec", "rollout_pool_backends", "start_rollout_group",
           "local_rollout_device"]

ROLLOUT_POOL = "rollout_pool"
ROLLOUT_GROUP = "rollout"
ROLLOUT_CONCURRENCY = 2
"""Calls a rollout worker runs at once: a generation, and a weight push that arrives meanwhile."""


def rollout_pool_spec(cfg: DictConfig) -> dict[str, list[int]]:
    """The rollout's pool: ``rollout.n_gpus_per_node`` workers on each of ``rollout.nnodes`` nodes
    (one child process on the local backend)."""
    if cfg.trainer.backend == "local":
        return {ROLLOUT_POOL: [1]}
    return {ROLLOUT_POOL: [cfg.rollout.n_gpus_per_node] * cfg.rollout.nnodes}


def rollout_pool_backends(cfg: DictConfig) -> dict[str, str]:
    """The rollout pool's backend where it is not the trainer's: a child process on the local backend."""
    return {ROLLOUT_POOL: "process"} if cfg.trainer.backend == "local" else {}


def local_rollout_device(cfg: DictConfig) -> str:
    """The device of the local backend's rollout child: ``cuda:0`` on a CUDA run (the child is rank 0
    of its group and sees every GPU, so it picks device 0, as the driver's actor does), else ``cpu``."""
    device = cfg.trainer.device
    on_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    return "cuda:0" if on_cuda else "cpu"


def start_rollout_group(cfg: DictConfig, pools: Any, worker_cls: type,
                        give_weights: Callable[[WorkerGroup], None]) -> WorkerGroup:
    """Start the rollout workers (``role="rollout"``) in the rollout pool of ``pools`` (a
    ``ResourcePoolManager`` whose pools exist), load their models and hand the group to
    ``give_weights`` (it sends the last weights pushed to the rollout: a restarted group goes on
    with the current policy)."""
    pool_name = pools.pool_name(Role.Rollout)
    group_cls = get_worker_group_cls(pools.backend_of(pool_name))
    group = group_cls(resource_pool=pools.resource_pool_dict[pool_name],
                      ray_cls_with_init=ClassWithInitArgs(worker_cls, config=cfg, role="rollout"),
                      name_prefix=f"{ROLLOUT_GROUP}_{uuid.uuid4().hex[:6]}", call_timeout_s=cfg.trainer.call_timeout_s,
                      max_concurrency=ROLLOUT_CONCURRENCY)
    group.init_model()
    give_weights(group)
    return group
