"""Backend-neutral single-controller pieces: Worker, register/Dispatch/Execute, WorkerGroup."""

from rlvr.single_controller.base.colocate import create_colocated_worker_cls
from rlvr.single_controller.base.decorator import Dispatch, Execute, register
from rlvr.single_controller.base.worker import RankInfo, Worker
from rlvr.single_controller.base.worker_group import ClassWithInitArgs, ResourcePool, WorkerFuture, WorkerGroup

__all__ = [
    "ClassWithInitArgs",
    "Dispatch",
    "Execute",
    "RankInfo",
    "ResourcePool",
    "Worker",
    "WorkerFuture",
    "WorkerGroup",
    "create_colocated_worker_cls",
    "register",
]
