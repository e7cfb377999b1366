"""The reward-worker registry: the names ``reward.routes`` sends a domain to.

An entry is a reward worker class (a :class:`~rlvr.single_controller.base.worker.Worker` with
``initialize(pipeline_config)`` and ``compute_rewards(data)``, see :mod:`rlvr.reward.workers.base`)
and the config dataclass its constructor takes. A built-in name has a section of the same name
under ``reward.workers`` in the run config; a worker registered by the user is built with its
config class's defaults (``tokenizer_path`` set to the policy's tokenizer).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rlvr.reward.config import RewardWorkerConfig
from rlvr.utils.registry import Registry


@dataclass(frozen=True)
class RewardWorkerSpec:
    """A registered reward worker: its class and the config dataclass it is constructed with."""

    worker_cls: type
    config_cls: type[RewardWorkerConfig]


REWARD_WORKER_REGISTRY: Registry[RewardWorkerSpec] = Registry("reward worker")


def register_reward_worker(name: str, config_cls: type[RewardWorkerConfig]) -> Callable[[type], type]:
    """Class decorator adding a reward worker under ``name`` (a duplicate name raises)."""

    def add(worker_cls: type) -> type:
        REWARD_WORKER_REGISTRY.add(name, RewardWorkerSpec(worker_cls, config_cls))
        return worker_cls

    return add


def get_reward_worker(name: str) -> RewardWorkerSpec:
    """The entry registered as ``name``; an unknown name raises ``KeyError`` listing the valid ones."""
    return REWARD_WORKER_REGISTRY.get(name)
