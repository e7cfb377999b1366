"""``Worker``: the base class of every role worker (actor, rollout, reference, critic, reward).

A worker is one process per device (a Ray actor, or the driver itself with the local backend).
Its place in the group comes from the environment that the worker group sets before starting it,
as verl sets it: ``RANK`` / ``WORLD_SIZE`` (in the group), ``RAY_LOCAL_RANK`` /
``RAY_LOCAL_WORLD_SIZE`` (among the group's workers on its node), ``LOCAL_RANK`` /
``LOCAL_WORLD_SIZE`` (the worker's device among the devices visible to its process: ``0`` / ``1``
for a Ray actor, which sees only its own GPU), ``MASTER_ADDR`` / ``MASTER_PORT`` (rendezvous of
rank 0), ``WG_PREFIX`` / ``WG_BACKEND``; the user's modules that the driver imported come in
``RLVR_USER_CODE`` and are imported first (:mod:`rlvr.utils.user_code`).
"""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass
from datetime import timedelta
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from rlvr.single_controller.base.decorator import Dispatch, Execute, register
from rlvr.utils.errors import ProtocolError, ProtocolKeyError
from rlvr.utils.user_code import import_user_code_from_env


@dataclass
class RankInfo:
    """Where a worker sits in its group; a worker may change the dp/tp fields in ``__init__``.

    ``DP_MP_COMPUTE`` / ``DP_MP_DISPATCH_FIRST`` send data chunk ``dp_rank`` (of ``dp_size``) to the
    worker and collect the output of the ranks with ``is_collect`` (``tp_rank == 0``).
    """

    rank: int
    world_size: int
    dp_rank: int
    dp_size: int
    tp_rank: int = 0
    tp_size: int = 1

    @property
    def is_collect(self) -> bool:
        """Whether the driver keeps this rank's output (one rank per data-parallel group)."""
        return self.tp_rank == 0


def free_port() -> int:
    """A TCP port that is free on this host right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


NOSET_VISIBLE_DEVICES = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"
"""Set, Ray leaves ``CUDA_VISIBLE_DEVICES`` alone: each actor sees every GPU of its node."""


def noset_local_rank(env: Mapping[str, str], gpu_ids: Sequence[str]) -> str | None:
    """``LOCAL_RANK`` of a Ray actor that sees every GPU of its node (``NOSET_VISIBLE_DEVICES`` set in
    ``env``): the first of ``gpu_ids``, the GPUs Ray gave it; None otherwise (verl's rule; the actor
    then sees only its own GPU, index 0)."""
    if not env.get(NOSET_VISIBLE_DEVICES) or not gpu_ids:
        return None
    return str(gpu_ids[0])


def _ray_gpu_ids() -> list[str]:
    """The GPUs Ray gave this process (an actor), [] outside Ray."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return []
    return list(ray.get_runtime_context().get_accelerator_ids().get("GPU", []))


def node_ip() -> str:
    """IP address of this node as Ray sees it, or loopback outside Ray.

    Ray is looked up among the loaded modules rather than imported: the local backend must run
    where Ray is not installed (e.g. a GPU machine that cannot carry Ray's wheel).
    """
    ray = sys.modules.get("ray")
    return ray.util.get_node_ip_address() if ray is not None and ray.is_initialized() else "127.0.0.1"


class Worker:
    """Base class of role workers.

    Args:
        worker_config: the role's config object, kept as ``self.worker_config``.

    Attributes:
        rank, world_size, local_rank: from ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` (default 0, 1, 0);
            with ``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES`` set, ``LOCAL_RANK`` becomes the GPU
            Ray gave the actor (:func:`noset_local_rank`).
        master_addr, master_port: rendezvous of ``torch.distributed``; rank 0 picks them when the
            environment has none (the worker group then hands them to the other ranks).
        device: ``"cuda:<i>"`` when a GPU is visible to this process, else ``"cpu"``.
        rank_info: ``RankInfo`` used by the DP_MP dispatch modes.
    """

    def __init__(self, worker_config: Any = None) -> None:
        import_user_code_from_env()  # the user's modules, before the worker builds anything
        self.worker_config = worker_config
        device_rank = noset_local_rank(os.environ, _ray_gpu_ids())
        if device_rank is not None:
            os.environ["LOCAL_RANK"] = device_rank
        self.rank = int(os.environ.get("RANK", "0"))
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if "MASTER_ADDR" not in os.environ and self.rank == 0:
            os.environ["MASTER_ADDR"] = node_ip()
            os.environ["MASTER_PORT"] = str(free_port())
        self.master_addr = os.environ.get("MASTER_ADDR", "")
        self.master_port = int(os.environ.get("MASTER_PORT", "0"))
        self.device = self._pick_device()
        self.rank_info = RankInfo(
            rank=self.rank, world_size=self.world_size, dp_rank=self.rank, dp_size=self.world_size
        )
        self._dispatch_dp_rank: dict[str, int] = {}
        self._collect_dp_rank: dict[str, bool] = {}

    def _pick_device(self) -> str:
        if not torch.cuda.is_available():
            return "cpu"
        count = torch.cuda.device_count()
        return f"cuda:{self.local_rank if count > 1 else 0}"

    def get_rank_info(self) -> RankInfo:
        """The worker's current ``RankInfo`` (the worker group reads it for DP_MP dispatch)."""
        return self.rank_info

    def get_master_address(self) -> tuple[str, int]:
        """``(MASTER_ADDR, MASTER_PORT)`` of this worker (rank 0 chooses them)."""
        return self.master_addr, self.master_port

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_process_group(self, backend: str | None = None, timeout_s: float = 600.0) -> str:
        """Join ``torch.distributed`` with the other ranks of the group (idempotent).

        Args:
            backend: ``"gloo"`` or ``"nccl"``; default NCCL on GPU, gloo on CPU.
            timeout_s: timeout of the rendezvous and of every collective.

        Returns:
            the backend in use.
        """
        if dist.is_initialized():
            return dist.get_backend()
        backend = backend or ("nccl" if self.device.startswith("cuda") else "gloo")
        if backend == "nccl":
            torch.cuda.set_device(self.device)
        dist.init_process_group(
            backend=backend,
            init_method=f"tcp://{self.master_addr}:{self.master_port}",
            rank=self.rank,
            world_size=self.world_size,
            timeout=timedelta(seconds=timeout_s),
        )
        return backend

    def _register_dispatch_collect_info(self, mesh_name: str, dp_rank: int, is_collect: bool) -> None:
        """Place this worker in the data-parallel layout of ``mesh_name`` (verl's nd dispatch,
        ``make_nd_compute_dataproto_dispatch_fn``): it gets part ``dp_rank`` of the data, and its
        output is kept when ``is_collect``.

        Raises:
            ValueError: ``mesh_name`` is registered already.
        """
        if mesh_name in self._dispatch_dp_rank:
            raise ValueError(f"mesh_name {mesh_name} has been registered (dp_rank {self._dispatch_dp_rank[mesh_name]})")
        self._dispatch_dp_rank[mesh_name], self._collect_dp_rank[mesh_name] = int(dp_rank), bool(is_collect)

    def get_dispatch_collect(self) -> dict[str, dict]:
        """``{"dispatch_dp_rank": {mesh: dp rank}, "collect_dp_rank": {mesh: kept}}`` of this worker."""
        return {"dispatch_dp_rank": dict(self._dispatch_dp_rank), "collect_dp_rank": dict(self._collect_dp_rank)}

    def set_dispatch_collect(self, mesh_name: str, dispatch_dp_rank: dict[str, int],
                             collect_dp_rank: dict[str, bool]) -> None:
        """Take another worker's layout (its :meth:`get_dispatch_collect`, one mesh) as this worker's
        ``mesh_name`` (a worker that plays several roles takes each role's).

        Raises:
            ProtocolError: ``mesh_name`` is registered here already, or the layout holds other than one mesh.
        """
        if mesh_name in self._dispatch_dp_rank:
            raise ProtocolError(f"{mesh_name} is already registered ({sorted(self._dispatch_dp_rank)})")
        if len(dispatch_dp_rank) != 1 or len(collect_dp_rank) != 1:
            raise ProtocolError(f"set_dispatch_collect takes the layout of one mesh, got {sorted(dispatch_dp_rank)}")
        self._register_dispatch_collect_info(mesh_name, next(iter(dispatch_dp_rank.values())),
                                             next(iter(collect_dp_rank.values())))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def _query_dispatch_info(self, mesh_name: str) -> int:
        """This worker's dp rank in ``mesh_name``."""
        if mesh_name not in self._dispatch_dp_rank:
            raise ProtocolKeyError(f"{mesh_name} is not registered in {type(self).__name__}; call "
                                   "self._register_dispatch_collect_info(mesh_name, dp_rank, is_collect) in __init__")
        return self._dispatch_dp_rank[mesh_name]

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def _query_collect_info(self, mesh_name: str) -> bool:
        """Whether this worker's output is collected in ``mesh_name``."""
        if mesh_name not in self._collect_dp_rank:
            raise ProtocolKeyError(f"{mesh_name} is not registered in {type(self).__name__}; call "
                                   "self._register_dispatch_collect_info(mesh_name, dp_rank, is_collect) in __init__")
        return self._collect_dp_rank[mesh_name]

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO_WITH_FUNC)
    def execute_with_func_generator(self, func: Callable, *args: Any, **kwargs: Any) -> Any:
        """Run ``func(worker, *args, **kwargs)`` on every rank with its part of the DataProto
        arguments; the group concatenates the returned DataProtos (verl's helper)."""
        return func(self, *args, **kwargs)

    @register(dispatch_mode=Dispatch.ALL_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def execute_func_rank_zero(self, func: Callable, *args: Any, **kwargs: Any) -> Any:
        """Run ``func(*args, **kwargs)`` on rank 0 and return its result (verl's helper)."""
        return func(*args, **kwargs)
