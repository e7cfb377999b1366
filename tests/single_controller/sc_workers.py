"""Worker classes shared by the single-controller tests (imported by the Ray workers too)."""

from __future__ import annotations

import os
import sys
import time

import pytest
import torch
import torch.distributed as dist

from rlvr.protocol import DataProto
from rlvr.single_controller import Dispatch, Execute, RankInfo, Worker, register

BACKENDS = [pytest.param("ray", marks=[pytest.mark.ray, pytest.mark.slow]), "local", "process"]
SEPARATE_PROCESS_BACKENDS = [pytest.param("ray", marks=[pytest.mark.ray, pytest.mark.slow]), "process"]
"""The backends whose workers live in processes of their own (they can hang or die apart from the driver)."""
MULTI_WORKERS = 2


def world_size_of(backend: str) -> int:
    """Workers of a test group: 2 Ray actors or child processes, or the one local worker."""
    return 1 if backend == "local" else MULTI_WORKERS


def _spread(group, x: list):
    """Custom dispatch: rank r gets ``x[r::world_size]``."""
    n = group.world_size
    return ([x[r::n] for r in range(n)],), {}


def _total(group, outputs: list) -> int:
    """Custom collect: the sum of every rank's output."""
    return sum(outputs)


def _tagged(data: DataProto, y: torch.Tensor, rank: int) -> DataProto:
    """``y [batch]`` and ``rank [batch]`` (the rank that computed each row)."""
    return DataProto.from_dict(tensors={"y": y, "rank": torch.full((len(data),), rank)})


class DemoWorker(Worker):
    """Every dispatch mode on toy data; ``scale`` multiplies the DataProto outputs."""

    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        self.scale = scale
        self.received: int | None = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def info(self) -> dict:
        return {"rank": self.rank, "world_size": self.world_size, "pid": os.getpid(), "device": self.device,
                "master": (self.master_addr, self.master_port)}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def add_rank(self, x: int) -> int:
        return x + self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def module_value(self, name: str) -> object:
        """``VALUE`` of the module ``name`` if this process imported it (None if it did not)."""
        return getattr(sys.modules.get(name), "VALUE", None)

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def mul(self, x: int, factor: int) -> int:
        return x * factor

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def whoami(self, tag: str) -> tuple[str, int]:
        return tag, self.rank

    @register(dispatch_mode=Dispatch.ALL_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def only_rank_zero(self, x: int) -> tuple[int, int]:
        return x, self.rank

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def square(self, x: int) -> int:
        return x * x

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def double(self, data: DataProto) -> DataProto:
        return _tagged(data, 2 * self.scale * data.batch["x"], self.rank)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def double_x_async(self, data: DataProto) -> DataProto:
        """``x [batch]`` doubled (non-blocking on the driver)."""
        return DataProto.from_dict(tensors={"x": 2 * data.batch["x"]})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO_WITH_FUNC)
    def apply(self, fn, data: DataProto) -> DataProto:
        return _tagged(data, fn(data.batch["x"]), self.rank)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def set_tp(self, tp_size: int) -> None:
        """Model-parallel layout: ``tp_size`` consecutive ranks share one data-parallel rank."""
        self.rank_info = RankInfo(
            rank=self.rank, world_size=self.world_size, dp_rank=self.rank // tp_size,
            dp_size=self.world_size // tp_size, tp_rank=self.rank % tp_size, tp_size=tp_size,
        )

    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE)
    def mp_double(self, data: DataProto) -> DataProto:
        self.received = len(data)
        return _tagged(data, 2 * data.batch["x"], self.rank)

    @register(dispatch_mode=Dispatch.DP_MP_DISPATCH_FIRST)
    def mp_first(self, data: DataProto | None) -> DataProto | None:
        self.received = None if data is None else len(data)
        return None if data is None else _tagged(data, 2 * data.batch["x"], self.rank)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def last_received(self) -> int | None:
        return self.received

    @register(dispatch_mode={"dispatch_fn": _spread, "collect_fn": _total})
    def sum_list(self, xs: list) -> int:
        return sum(xs)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def slow_add_rank(self, x: int, delay_s: float) -> int:
        time.sleep(delay_s)
        return x + self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def fail_on(self, rank: int) -> int:
        if self.rank == rank:
            raise ValueError(f"deliberate failure on rank {self.rank}")
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sleep(self, seconds: float) -> int:
        time.sleep(seconds)
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def exit_on(self, rank: int) -> int:
        if self.rank == rank:
            os._exit(1)
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def all_reduce(self, value: float) -> float:
        """Sum of ``value * (rank + 1)`` over the group."""
        tensor = torch.tensor([value * (self.rank + 1)])
        dist.all_reduce(tensor)
        return tensor.item()


class OtherRoleWorker(Worker):
    """A second role for colocation tests (shares method names with DemoWorker on purpose)."""

    def __init__(self, offset: int) -> None:
        super().__init__()
        self.offset = offset

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def info(self) -> dict:
        return {"rank": self.rank, "pid": os.getpid(), "offset": self.offset}

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def double(self, data: DataProto) -> DataProto:
        return _tagged(data, 2 * data.batch["x"] + self.offset, self.rank)


class BrokenWorker(Worker):
    """A worker whose constructor raises on the group's last rank only."""

    def __init__(self) -> None:
        super().__init__()
        if self.rank == self.world_size - 1:
            raise RuntimeError(f"deliberate constructor failure on rank {self.rank}")


def late_part(delay_s: float, fail: bool) -> DataProto:
    """A DataProto part computed by a Ray task (for DataProtoFuture timeouts and failures)."""
    time.sleep(delay_s)
    if fail:
        raise ValueError("deliberate failure of a part")
    return DataProto.from_dict(tensors={"x": torch.zeros(1)})


ENV_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "RAY_LOCAL_RANK", "RAY_LOCAL_WORLD_SIZE",
            "MASTER_ADDR", "MASTER_PORT", "WG_PREFIX", "WG_BACKEND")


class EnvWorker(Worker):
    """Reports the environment variables it was started with (read in ``__init__``, when the local
    backend's worker sees them too) and as its methods see them later (``getenv``, verl's test helper)."""

    def __init__(self, extra_keys: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.at_init = {key: os.environ.get(key) for key in (*ENV_KEYS, *extra_keys)}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def env_at_init(self) -> dict:
        return self.at_init

    def getenv(self, key: str) -> str:
        return os.getenv(key, f"{key} not set")
