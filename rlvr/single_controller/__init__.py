"""Single controller: one driver process calls methods on groups of role workers (Ray or local).

See ``docs/single_controller.md`` for the data flow of one call.
"""

from rlvr.single_controller.backend import get_resource_pool_cls, get_worker_group_cls
from rlvr.single_controller.base import (
    ClassWithInitArgs,
    Dispatch,
    Execute,
    RankInfo,
    ResourcePool,
    Worker,
    WorkerFuture,
    WorkerGroup,
    create_colocated_worker_cls,
    register,
)
from rlvr.single_controller.local import LocalResourcePool, LocalWorkerGroup
from rlvr.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup, init_ray

__all__ = [
    "ClassWithInitArgs",
    "Dispatch",
    "Execute",
    "LocalResourcePool",
    "LocalWorkerGroup",
    "RankInfo",
    "RayClassWithInitArgs",
    "RayResourcePool",
    "RayWorkerGroup",
    "ResourcePool",
    "Worker",
    "WorkerFuture",
    "WorkerGroup",
    "create_colocated_worker_cls",
    "get_resource_pool_cls",
    "get_worker_group_cls",
    "init_ray",
    "register",
]
