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
from typing import Any

from rlvr.reward.config import RewardWorkerConfig
from rlvr.single_controller.base.worker import Worker
from rlvr.utils.registry import Registry


@dataclass(frozen=True)
class RewardWorkerSpec:
    """A registered reward worker: its class and the config dataclass it is constructed with."""

    worker_cls: type
    config_cls: type[RewardWorkerConfig]


def _worker_spec(obj: Any) -> RewardWorkerSpec:
    """A class loaded by path (``pkg.module:Class``) that is not registered: a ``Worker`` subclass,
    built with the base :class:`~rlvr.reward.config.RewardWorkerConfig` (register it with
    :func:`register_reward_worker` to give it a config class of its own)."""
    if not (isinstance(obj, type) and issubclass(obj, Worker)):
        raise TypeError(f"{obj!r} is not a reward worker class (a subclass of Worker)")
    return RewardWorkerSpec(obj, RewardWorkerConfig)


REWARD_WORKER_REGISTRY: Registry[RewardWorkerSpec] = Registry(
    "reward worker", identity=lambda spec: spec.worker_cls, coerce=_worker_spec)


def register_reward_worker(name: str, config_cls: type[RewardWorkerConfig]) -> Callable[[type], type]:
    """Class decorator adding a reward worker under ``name`` (a duplicate name raises)."""

    def add(worker_cls: type) -> type:
        REWARD_WORKER_REGISTRY.add(name, RewardWorkerSpec(worker_cls, config_cls))
        return worker_cls

    return add


def get_reward_worker(name: str) -> RewardWorkerSpec:
    """The entry registered as ``name``; an unknown name raises ``KeyError`` listing the valid ones."""
    return REWARD_WORKER_REGISTRY.get(name)
