"""Single controller: one driver process calls methods on groups of role workers (Ray, local, or
child processes of the driver).

See ``docs/single_controller.md`` for the data flow of one call.
"""

from rlvr.single_controller.backend import get_resource_pool_cls, get_worker_group_cls
from rlvr.single_controller.base import (
    DISPATCH_MODE_FN_REGISTRY,
    ClassWithInitArgs,
    Dispatch,
    Execute,
    RankInfo,
    ResourcePool,
    Worker,
    WorkerFuture,
    WorkerGroup,
    create_colocated_worker_cls,
    create_colocated_worker_raw_cls,
    get_predefined_dispatch_fn,
    register,
    register_dispatch_mode,
    update_dispatch_mode,
)
from rlvr.single_controller.local import LocalResourcePool, LocalWorkerGroup
from rlvr.single_controller.process import ProcessResourcePool, ProcessWorkerGroup

_RAY_NAMES = ("RayClassWithInitArgs", "RayResourcePool", "RayWorkerGroup", "init_ray")


def __getattr__(name: str):
    """The Ray backend's names, imported on first use so that the local backend runs without Ray."""
    if name in _RAY_NAMES:
        from rlvr.single_controller import ray as ray_backend

        return getattr(ray_backend, name)
    raise AttributeError(f"module 'rlvr.single_controller' has no attribute {name!r}")


__all__ = [
    "DISPATCH_MODE_FN_REGISTRY",
    "ClassWithInitArgs",
    "Dispatch",
    "Execute",
    "LocalResourcePool",
    "LocalWorkerGroup",
    "ProcessResourcePool",
    "ProcessWorkerGroup",
    "RankInfo",
    "RayClassWithInitArgs",
    "RayResourcePool",
    "RayWorkerGroup",
    "ResourcePool",
    "Worker",
    "WorkerFuture",
    "WorkerGroup",
    "create_colocated_worker_cls",
    "create_colocated_worker_raw_cls",
    "get_predefined_dispatch_fn",
    "get_resource_pool_cls",
    "get_worker_group_cls",
    "init_ray",
    "register",
    "register_dispatch_mode",
    "update_dispatch_mode",
]
