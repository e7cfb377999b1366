"""Worker classes written as a verl 0.9 user writes them, with only ``verl`` renamed to ``rlvr``:
``@ray.remote`` on the class, ``@register`` with ``Dispatch`` modes, a custom mode from the
dispatch-mode registry, ``DataProto`` in and out. Imported by the Ray workers too (pickled by value).
"""

from __future__ import annotations

import asyncio

import ray
import torch

from rlvr import DataProto
from rlvr.single_controller.base import Worker
from rlvr.single_controller.base.decorator import (
    Dispatch,
    Execute,
    collect_all_to_all,
    register,
    register_dispatch_mode,
)
from rlvr.single_controller.ray.base import RayClassWithInitArgs, create_colocated_worker_raw_cls


def first_two_to_all(worker_group, *args, **kwargs):
    """Custom dispatch: every argument is a list of 2; rank r gets item ``r % 2``."""
    n = worker_group.world_size
    return tuple([a[r % 2] for r in range(n)] for a in args), {k: [v[r % 2] for r in range(n)] for k, v in kwargs.items()}


def sum_outputs(worker_group, output):
    """Custom collect: the sum of the per-rank outputs."""
    return sum(output)


if "SPREAD_SUM" not in Dispatch:
    register_dispatch_mode("SPREAD_SUM", first_two_to_all, sum_outputs)


@ray.remote
class AdderWorker(Worker):
    """``x`` fixed at construction; every method adds it to its inputs."""

    def __init__(self, x) -> None:
        super().__init__()
        self._x = x

    def foo(self, y):
        return self._x + y

    @register(Dispatch.ONE_TO_ALL)
    def one_to_all(self, y):
        return self._x + y + self.rank

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def one_to_all_async(self, y):
        return self._x + y + self.rank

    @register(Dispatch.ALL_TO_ALL)
    def all_to_all(self, y):
        return self._x + y

    @register(dispatch_mode=Dispatch.ALL_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def on_rank_zero(self, y, z):
        return self._x + y + z, self.rank

    @register(Dispatch.DP_COMPUTE)
    def dp_compute(self, y):
        return self._x * y

    @register(dispatch_mode={"dispatch_fn": first_two_to_all, "collect_fn": collect_all_to_all})
    def custom_dict(self, y):
        return self._x + y

    @register(dispatch_mode=Dispatch.SPREAD_SUM)
    def custom_registered(self, y):
        return self._x * y

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def add_x(self, data: DataProto) -> DataProto:
        """``a += x`` and ``rank`` = the rank that saw the row."""
        data.batch["a"] += self._x
        data.batch["rank"] = torch.full((len(data),), self.rank)
        return data

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def add_x_async(self, data: DataProto) -> DataProto:
        data.batch["a"] += self._x
        return data

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, materialize_futures=False)
    def resolve_and_add_x(self, data) -> DataProto:
        """Receives this rank's ``DataProtoFuture`` part and resolves it in the worker."""
        data = data.get()
        data.batch["a"] += self._x
        return data

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO_WITH_FUNC)
    def apply(self, func, data: DataProto) -> DataProto:
        return DataProto.from_dict(tensors={"a": func(data.batch["a"])})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRIC)
    def row_count(self, data: DataProto) -> dict:
        return {"rows": len(data), "sum": float(data.batch["a"].sum())}


class CriticLikeWorker(Worker):
    """A second role for colocation (plain class, as verl's fused-worker tests pass it)."""

    def __init__(self, config) -> None:
        super().__init__()
        self.config = config

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def sub(self, data: DataProto) -> DataProto:
        data.batch["a"] -= self.config["b"]
        return data


def plus_one(x):
    """For ``execute_func_rank_zero``."""
    return x + 1


def doubled_a(worker, data: DataProto) -> DataProto:
    """For ``execute_with_func_generator``: ``a * 2`` and the worker's rank."""
    return DataProto.from_dict(tensors={"a": data.batch["a"] * 2, "rank": torch.full((len(data),), worker.rank)})


@ray.remote
class AsyncComputeWorker(Worker):
    """``async def`` worker methods registered with a dispatch mode (verl's decorator tests)."""

    def __init__(self, initial_value=0) -> None:
        super().__init__()
        self.value = initial_value

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def dp_compute(self, data: DataProto) -> DataProto:
        data.batch["output"] = data.batch["input"] + self.value + self.rank
        return data

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    async def async_dp_compute(self, data: DataProto) -> DataProto:
        await asyncio.sleep(0.01)
        data.batch["output_async"] = data.batch["input"] * 2 + self.value + self.rank
        return data

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    async def async_one_to_all(self, x):
        await asyncio.sleep(0.01)
        return x + self.rank


@ray.remote
class FusedActor(Worker):
    """A role of verl's fused-worker test: ``add`` adds the rank."""

    def __init__(self) -> None:
        super().__init__()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def add(self, x):
        return x + self.rank


@ray.remote
class FusedCritic(Worker):
    """The other role: ``sub`` subtracts the value it was built with."""

    def __init__(self, val) -> None:
        super().__init__()
        self.val = val

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def sub(self, x):
        return x - self.val


FUSED_ROLES = {"actor": RayClassWithInitArgs(cls=FusedActor), "critic": RayClassWithInitArgs(cls=FusedCritic, val=10)}
FusedBase = create_colocated_worker_raw_cls(FUSED_ROLES)


@ray.remote
class HybridWorker(FusedBase):
    """A user's subclass of the fused class: one method that calls both roles in its process."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def foo(self, x):
        return self.critic.sub(self.actor.add(x))
