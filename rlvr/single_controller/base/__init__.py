"""Backend-neutral single-controller pieces: Worker, register/Dispatch/Execute, WorkerGroup."""

from rlvr.single_controller.base.colocate import create_colocated_worker_cls, create_colocated_worker_raw_cls
from rlvr.single_controller.base.decorator import (
    DISPATCH_MODE_FN_REGISTRY,
    Dispatch,
    Execute,
    get_predefined_dispatch_fn,
    register,
    register_dispatch_mode,
    update_dispatch_mode,
)
from rlvr.single_controller.base.worker import RankInfo, Worker
from rlvr.single_controller.base.worker_group import ClassWithInitArgs, ResourcePool, WorkerFuture, WorkerGroup

__all__ = [
    "DISPATCH_MODE_FN_REGISTRY",
    "ClassWithInitArgs",
    "Dispatch",
    "Execute",
    "RankInfo",
    "ResourcePool",
    "Worker",
    "WorkerFuture",
    "WorkerGroup",
    "create_colocated_worker_cls",
    "create_colocated_worker_raw_cls",
    "get_predefined_dispatch_fn",
    "register",
    "register_dispatch_mode",
    "update_dispatch_mode",
]
