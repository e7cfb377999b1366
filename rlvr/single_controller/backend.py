"""Choose the single-controller backend by name (``trainer.backend: ray | local``; ``process``: workers
in child processes of the driver, what the local backend runs a rollout apart from the actor with)."""

from __future__ import annotations

from typing import Any

from rlvr.single_controller.base.worker_group import ResourcePool, WorkerGroup
from rlvr.single_controller.local import LocalResourcePool, LocalWorkerGroup
from rlvr.single_controller.process import ProcessResourcePool, ProcessWorkerGroup
from rlvr.utils.errors import ConfigError

BACKENDS = ("local", "ray", "process")


def _lookup(backend: str) -> tuple[type[WorkerGroup], type[ResourcePool]]:
    if backend == "local":
        return LocalWorkerGroup, LocalResourcePool
    if backend == "process":
        return ProcessWorkerGroup, ProcessResourcePool
    if backend == "ray":
        # imported here so that the local backend runs where Ray is not installed
        from rlvr.single_controller.ray.base import RayResourcePool, RayWorkerGroup

        return RayWorkerGroup, RayResourcePool
    raise ConfigError("trainer.backend", f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")


def get_worker_group_cls(backend: str) -> type[WorkerGroup]:
    """``RayWorkerGroup`` for ``"ray"``, ``LocalWorkerGroup`` for ``"local"``, ``ProcessWorkerGroup`` for
    ``"process"``."""
    return _lookup(backend)[0]


def get_resource_pool_cls(backend: str) -> type[ResourcePool]:
    """``RayResourcePool`` for ``"ray"``, ``LocalResourcePool`` for ``"local"``, ``ProcessResourcePool``
    for ``"process"``."""
    return _lookup(backend)[1]


def start_worker_group(backend: str, process_on_nodes: list[int], use_gpu: bool, ray_cls_with_init: Any,
                       call_timeout_s: float, name_prefix: str) -> WorkerGroup:
    """A worker group of ``ray_cls_with_init`` on ``backend`` over a pool of ``process_on_nodes``
    (the tools' one-group runs: SFT, offline generation). Ray must be initialised already for ``"ray"``."""
    pool = get_resource_pool_cls(backend)(process_on_nodes=process_on_nodes, use_gpu=use_gpu)
    return get_worker_group_cls(backend)(resource_pool=pool, ray_cls_with_init=ray_cls_with_init,
                                         name_prefix=name_prefix, call_timeout_s=call_timeout_s,
                                         device_name="cuda" if use_gpu else "cpu")
