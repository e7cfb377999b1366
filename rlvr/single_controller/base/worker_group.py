"""``WorkerGroup``: the driver-side handle of a group of workers, shared by every backend.

A backend (Ray, local) only says how to start workers, how to submit one call to one rank and how
to wait for results (``_submit`` / ``_wait``). Everything else, binding the ``@register``-ed
methods, dispatch, execute, padding, collect, futures, timeouts and ``spawn``, lives here, so the
two backends run the same code path.
"""

from __future__ import annotations

import copy
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

from rlvr.protocol import DataProto, pad_dataproto_to_divisor, unpad_dataproto
from rlvr.single_controller.base.decorator import (
    DispatchSpec,
    Execute,
    RegisterSpec,
    registered_methods,
    resolve_dispatch,
)
from rlvr.single_controller.base.worker import RankInfo
from rlvr.utils.errors import WorkerError

DEFAULT_CALL_TIMEOUT_S = 3600.0


def default_call_timeout_s() -> float:
    """Timeout of a remote call: ``RLVR_CALL_TIMEOUT_S`` from the environment, else 3600 s."""
    return float(os.environ.get("RLVR_CALL_TIMEOUT_S", DEFAULT_CALL_TIMEOUT_S))


class ResourcePool:
    """Processes per node that a worker group occupies.

    Args:
        process_on_nodes: number of worker processes on each node, e.g. ``[2]``.
        max_colocate_count: how many worker groups may share one device (one bundle).
    """

    def __init__(self, process_on_nodes: Sequence[int], max_colocate_count: int = 1) -> None:
        if not process_on_nodes or any(n < 1 for n in process_on_nodes):
            raise ValueError(f"process_on_nodes needs at least one node with >= 1 process, got {process_on_nodes}")
        self.store = list(process_on_nodes)
        self.max_colocate_count = max_colocate_count

    @property
    def world_size(self) -> int:
        return sum(self.store)

    def local_world_size_list(self) -> list[int]:
        """For each rank, the number of processes on its node."""
        return [n for n in self.store for _ in range(n)]

    def local_rank_list(self) -> list[int]:
        """For each rank, its index on its node."""
        return [i for n in self.store for i in range(n)]

    def remove(self) -> None:
        """Give reserved resources back to the cluster (a pool without reservations has none)."""


class ClassWithInitArgs:
    """A worker class with the arguments to construct it later, in the worker process."""

    def __init__(self, cls: type, *args: Any, **kwargs: Any) -> None:
        self.cls = cls
        self.args = args
        self.kwargs = kwargs

    def __call__(self) -> Any:
        return self.cls(*self.args, **self.kwargs)


class WorkerFuture:
    """The pending result of a non-blocking call; ``get()`` waits (with the timeout) and collects.

    Attributes:
        handles: one backend handle per executed rank (``ray.ObjectRef`` with the Ray backend).
    """

    def __init__(
        self,
        group: WorkerGroup,
        method: str,
        ranks: list[int],
        handles: list,
        finish: Callable[[list], Any],
        timeout_s: float,
    ) -> None:
        self.group, self.method, self.ranks, self.handles = group, method, ranks, handles
        self._finish, self._timeout_s = finish, timeout_s
        self._done, self._value = False, None

    def get(self, timeout_s: float | None = None) -> Any:
        """The collected result; raises ``WorkerError`` / ``WorkerTimeoutError`` / ``WorkerDiedError``."""
        if not self._done:
            outputs = self.group._wait(self.handles, self.ranks, self.method, timeout_s or self._timeout_s)
            self._value, self._done = self._finish(outputs), True
        return self._value


def materialize(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Resolve ``WorkerFuture`` arguments to their values."""

    def value(v: Any) -> Any:
        return v.get() if isinstance(v, WorkerFuture) else v

    return tuple(value(a) for a in args), {k: value(v) for k, v in kwargs.items()}


class WorkerGroup(ABC):
    """Driver-side handle of ``world_size`` workers of one class.

    Each ``@register``-ed method ``m`` of the worker class becomes a method ``group.m(*args,
    _timeout_s=None, **kwargs)``. ``_timeout_s`` overrides the group's ``call_timeout_s`` for one call.

    Args:
        name: group name used in error messages.
        worker_cls: the worker class (a colocated class for ``spawn``).
        call_timeout_s: timeout of every call; default ``RLVR_CALL_TIMEOUT_S`` or 3600 s.
    """

    def __init__(self, name: str, worker_cls: type, call_timeout_s: float | None) -> None:
        self.name = name
        self.call_timeout_s = call_timeout_s or default_call_timeout_s()
        self._worker_cls = worker_cls
        self._workers: list = []
        self._method_prefix = ""
        self._rank_infos: list[RankInfo] | None = None
        self._state: dict[str, WorkerError | None] = {"failure": None}  # shared with spawned groups

    # ------------------------------------------------------------------ backend hooks
    @abstractmethod
    def _submit(self, rank: int, method: str, args: tuple, kwargs: dict) -> Any:
        """Start ``method`` on ``rank``; returns a handle for ``_wait``."""

    @abstractmethod
    def _wait(self, handles: list, ranks: list[int], method: str, timeout_s: float) -> list:
        """Outputs of ``handles`` in order; raises ``WorkerError`` subclasses (never hangs)."""

    def _fail(self, error: WorkerError) -> WorkerError:
        """Mark the group unusable after a timeout or a dead worker; returns ``error`` to raise."""
        self._state["failure"] = error
        return error

    def _check_usable(self, method: str) -> None:
        failure = self._state["failure"]
        if failure is not None:
            raise type(failure)(
                self.name,
                method,
                failure.rank,
                f"the group is unusable since method '{failure.method}' failed on rank {failure.rank} "
                f"({type(failure).__name__}); shut it down and start a new one. First failure:\n{failure}",
            )

    # ------------------------------------------------------------------ shared machinery
    @property
    def world_size(self) -> int:
        return len(self._workers)

    def _bind_worker_methods(self, user_cls: type, prefix: str = "") -> None:
        """Add a proxy for each registered method of ``user_cls`` (remote name ``prefix + name``)."""
        for name, spec in registered_methods(user_cls).items():
            if name.startswith(prefix):
                public = name[len(prefix) :]
                if public in dir(WorkerGroup):
                    raise TypeError(
                        f"{user_cls.__name__}.{name}: a registered method may not be called {public!r}, "
                        "which is a WorkerGroup attribute; rename the method"
                    )
                setattr(self, public, self._make_proxy(public, name, spec))

    def _make_proxy(self, public: str, remote: str, spec: RegisterSpec) -> Callable:
        dispatch = resolve_dispatch(spec.dispatch_mode)

        def proxy(*args: Any, _timeout_s: float | None = None, **kwargs: Any) -> Any:
            if spec.materialize_futures:
                args, kwargs = materialize(args, kwargs)
            future = self._call(remote, dispatch, spec.execute_mode, args, kwargs, _timeout_s)
            return future.get() if spec.blocking else future

        proxy.__name__ = public
        return proxy

    def _call(
        self,
        method: str,
        dispatch: DispatchSpec,
        execute_mode: Execute,
        args: tuple,
        kwargs: dict,
        timeout_s: float | None,
    ) -> WorkerFuture:
        """Dispatch -> execute; the returned future materialises and collects."""
        self._check_usable(method)
        if not dispatch.uses_rank_info:
            self._rank_infos = None  # the call may change the workers' rank_info
        pad = 0
        if dispatch.pad_divisor is not None:
            args, kwargs, pad = _pad_protos(args, kwargs, dispatch.pad_divisor(self))
        split_args, split_kwargs = dispatch.dispatch_fn(self, *args, **kwargs)
        ranks = list(range(self.world_size)) if execute_mode is Execute.ALL else [0]
        handles = [self._submit(rank, method, *_rank_slice(split_args, split_kwargs, rank)) for rank in ranks]

        def finish(outputs: list) -> Any:
            result = dispatch.collect_fn(self, outputs) if execute_mode is Execute.ALL else outputs[0]
            return unpad_dataproto(result, pad) if pad else result

        return WorkerFuture(self, method, ranks, handles, finish, timeout_s or self.call_timeout_s)

    def rank_infos(self) -> list[RankInfo]:
        """Every worker's ``RankInfo`` (queried again after any call that may have changed it)."""
        if self._rank_infos is None:
            infos = self._query_rank_infos("get_rank_info")
            _check_dp_layout(self.name, infos)
            self._rank_infos = infos
        return self._rank_infos

    def _query_rank_infos(self, label: str, timeout_s: float | None = None) -> list[RankInfo]:
        """Every worker's ``RankInfo``; errors name the call ``label`` (``"__init__"`` at start-up)."""
        self._check_usable(label)
        ranks = list(range(self.world_size))
        handles = [self._submit(rank, self._method_prefix + "get_rank_info", (), {}) for rank in ranks]
        return self._wait(handles, ranks, label, timeout_s or self.call_timeout_s)

    def execute_all_async(self, method: str, *args: Any, **kwargs: Any) -> WorkerFuture:
        """Run ``method`` on every rank; list arguments of length world_size are split by rank."""
        self._check_usable(method)
        n = self.world_size

        def split(v: Any) -> list:
            return v if isinstance(v, list) and len(v) == n else [v] * n

        per_rank_args = tuple(split(a) for a in args)
        per_rank_kwargs = {k: split(v) for k, v in kwargs.items()}
        ranks = list(range(n))
        handles = [self._submit(r, method, *_rank_slice(per_rank_args, per_rank_kwargs, r)) for r in ranks]
        return WorkerFuture(self, method, ranks, handles, lambda outputs: outputs, self.call_timeout_s)

    def execute_all_sync(self, method: str, *args: Any, **kwargs: Any) -> list:
        return self.execute_all_async(method, *args, **kwargs).get()

    def execute_rank_zero_async(self, method: str, *args: Any, **kwargs: Any) -> WorkerFuture:
        self._check_usable(method)
        handle = self._submit(0, method, args, kwargs)
        return WorkerFuture(self, method, [0], [handle], lambda outputs: outputs[0], self.call_timeout_s)

    def execute_rank_zero_sync(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self.execute_rank_zero_async(method, *args, **kwargs).get()

    execute_all = execute_all_async
    execute_rank_zero = execute_rank_zero_async

    def spawn(self, prefix_set: Sequence[str]) -> dict[str, WorkerGroup]:
        """Per-role groups over the same workers of a colocated group (see ``create_colocated_worker_cls``).

        The group of role ``r`` exposes the methods of that role under their own names.
        """
        role_classes = self._worker_cls_role_classes()
        groups = {}
        for role in prefix_set:
            if role not in role_classes:
                raise KeyError(f"worker group '{self.name}' has no role {role!r}; roles: {sorted(role_classes)}")
            group = copy.copy(self)
            group.name = f"{self.name}/{role}"
            group._method_prefix = f"{role}_"
            group._rank_infos = None
            group._bind_worker_methods(self._worker_cls, prefix=f"{role}_")
            groups[role] = group
        return groups

    def _worker_cls_role_classes(self) -> dict[str, type]:
        roles = self._worker_cls.__dict__.get("_rlvr_role_classes")
        if roles is None:
            raise TypeError(
                f"worker group '{self.name}' runs {self._worker_cls.__name__}, not a colocated class; "
                "build the class with create_colocated_worker_cls to use spawn()"
            )
        return roles


def _rank_slice(args: tuple[list, ...], kwargs: dict[str, list], rank: int) -> tuple[tuple, dict]:
    """The arguments of ``rank`` from per-rank argument lists."""
    return tuple(a[rank] for a in args), {k: v[rank] for k, v in kwargs.items()}


def _pad_protos(args: tuple, kwargs: dict, divisor: int) -> tuple[tuple, dict, int]:
    """Pad every DataProto argument to a multiple of ``divisor``; returns the (common) pad size."""
    pads = set()

    def pad(value: Any) -> Any:
        if not isinstance(value, DataProto):
            return value
        padded, pad_size = pad_dataproto_to_divisor(value, divisor)
        pads.add(pad_size)
        return padded

    args, kwargs = tuple(pad(a) for a in args), {k: pad(v) for k, v in kwargs.items()}
    if len(pads) > 1:
        raise ValueError("all DataProto arguments of one call must have the same length")
    return args, kwargs, pads.pop() if pads else 0


def _check_dp_layout(group: str, infos: list[RankInfo]) -> None:
    """Every dp rank in ``0..dp_size-1`` has exactly one collecting worker."""
    dp_size = infos[0].dp_size
    collect = sorted(info.dp_rank for info in infos if info.is_collect)
    if any(info.dp_size != dp_size for info in infos) or collect != list(range(dp_size)):
        layout = [(i.rank, i.dp_rank, i.dp_size, i.tp_rank) for i in infos]
        raise ValueError(
            f"worker group '{group}': inconsistent rank_info (rank, dp_rank, dp_size, tp_rank) = {layout}; "
            "every dp_rank in 0..dp_size-1 needs exactly one worker with tp_rank 0"
        )
