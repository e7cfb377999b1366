"""The trainer's worker groups, started, shut down and restarted together.

Roles mapped to one resource pool share its processes: they are fused into one colocated worker
class (one process per device) and ``spawn`` gives each role its own group handle over those
processes. Stateless groups (reward workers, an LLM judge) are :class:`RestartableGroup` handles:
a failure there restarts that group alone, and a full restart starts them again in the new pools.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlvr.single_controller import ClassWithInitArgs, WorkerGroup, create_colocated_worker_cls
from rlvr.trainer.ppo.resource_pool import ResourcePoolManager
from rlvr.trainer.ppo.utils import Role
from rlvr.trainer.recovery import Recovery, RestartableGroup


class TrainerWorkerGroups:
    """Start, shut down and restart the worker groups of a trainer.

    Args:
        resource_pool_manager: the pools and which role runs in which.
        worker_group_cls: ``RayWorkerGroup`` or ``LocalWorkerGroup``.
        call_timeout_s: timeout of every worker call.
    """

    def __init__(self, resource_pool_manager: ResourcePoolManager, worker_group_cls: type,
                 call_timeout_s: float) -> None:
        self.resource_pool_manager = resource_pool_manager
        self.worker_group_cls = worker_group_cls
        self.call_timeout_s = call_timeout_s
        self.colocated: list[WorkerGroup] = []
        self.stateless: list[RestartableGroup] = []

    def start(self, roles: dict[str, tuple[Role, ClassWithInitArgs]]) -> dict[str, WorkerGroup]:
        """Create the resource pools and one colocated group per pool; returns the group of each
        role name of ``roles`` (role name -> (role, worker class with its arguments))."""
        self.resource_pool_manager.create_resource_pool()
        by_pool: dict[int, tuple[Any, dict[str, ClassWithInitArgs]]] = {}
        for name, (role, cls) in roles.items():
            pool = self.resource_pool_manager.get_resource_pool(role)
            by_pool.setdefault(id(pool), (pool, {}))[1][name] = cls
        groups: dict[str, WorkerGroup] = {}
        for pool, class_dict in by_pool.values():
            fused = create_colocated_worker_cls(class_dict)
            group = self.worker_group_cls(resource_pool=pool, ray_cls_with_init=fused, call_timeout_s=self.call_timeout_s)
            self.colocated.append(group)
            groups.update(group.spawn(prefix_set=list(class_dict)))
        return groups

    def add_stateless(self, name: str, create: Callable[[], WorkerGroup], worker_cls: type, recovery: Recovery,
                      current_step: Callable[[], int]) -> RestartableGroup:
        """Start a stateless group that restarts alone (see :class:`RestartableGroup`)."""
        group = RestartableGroup(name, create, worker_cls, recovery, current_step)
        self.stateless.append(group)
        return group

    def restart_stateless(self) -> None:
        """Start the stateless groups again (after a full restart replaced the pools)."""
        for group in self.stateless:
            group.rebuild()

    def shutdown(self) -> None:
        """Kill every worker (hung ones too) and give the pools' reservations back."""
        for group in [*self.colocated, *self.stateless]:
            group.shutdown()
        self.colocated.clear()
        for pool in self.resource_pool_manager.resource_pool_dict.values():
            pool.remove()
