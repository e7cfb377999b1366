"""``WorkerGroup``: the driver-side handle of a group of workers, shared by every backend.

A backend (Ray, local) only says how to start workers, how to submit one call to one rank and how
to wait for results (``_submit`` / ``_wait``). Everything else, binding the ``@register``-ed
methods, dispatch, execute, padding, collect, futures, timeouts and ``spawn``, lives here, so the
two backends run the same code path.
"""

from __future__ import annotations

import copy
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from rlvr.protocol import DataProto, DataProtoFuture, unpad_dataproto
from rlvr.single_controller.base.decorator import (
    PROTO_MODES,
    RANK_INFO_MODES,
    Dispatch,
    Execute,
    RegisterSpec,
    registered_methods,
    resolve_dispatch,
)
from rlvr.single_controller.base.dispatch import PADDING_SIZE_KEY
from rlvr.single_controller.base.worker import RankInfo
from rlvr.utils.errors import ProtocolError, ProtocolKeyError, ProtocolTypeError, WorkerError
from rlvr.utils.futures import WorkerFuture, default_call_timeout_s


class ResourcePool:
    """Processes per node that a worker group occupies.

    Args:
        process_on_nodes: number of worker processes on each node, e.g. ``[2]``.
        max_colocate_count: how many worker groups may share one device (one bundle); each worker
            takes a ``1 / max_colocate_count`` share of it (verl's default, 10).
    """

    def __init__(self, process_on_nodes: Sequence[int], max_colocate_count: int = 10) -> None:
        if not process_on_nodes or any(n < 1 for n in process_on_nodes):
            raise ProtocolError(f"process_on_nodes needs at least one node with >= 1 process, got {process_on_nodes}")
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


def unwrap_ray_remote(cls: Any) -> tuple[type, Any]:
    """``(plain class, ray actor class or None)`` of a worker class given plain or wrapped with
    ``ray.remote(...)`` (a wrapped class keeps the options given to ``ray.remote``)."""
    ray = sys.modules.get("ray")  # a ray.remote class implies that Ray is imported
    if ray is not None and isinstance(cls, ray.actor.ActorClass):
        return cls.__ray_actor_class__, cls
    if not isinstance(cls, type):
        raise ProtocolTypeError(f"a worker class (plain or wrapped with ray.remote) is needed, got {cls!r}")
    return cls, None


class ClassWithInitArgs:
    """A worker class with the arguments to construct it later, in the worker process.

    Args:
        cls: the worker class, plain or wrapped with ``ray.remote(...)`` as verl users pass it
            (``cls`` is then stored unwrapped; the Ray backend starts the actors from the wrapper
            in ``actor_cls``, so its options apply).
        *args, **kwargs: constructor arguments.
    """

    def __init__(self, cls: Any, *args: Any, **kwargs: Any) -> None:
        self.cls, self.actor_cls = unwrap_ray_remote(cls)
        self.args = args
        self.kwargs = kwargs

    def __call__(self) -> Any:
        return self.cls(*self.args, **self.kwargs)

    @property
    def runtime_env(self) -> dict[str, Any]:
        """The ``runtime_env`` given to ``ray.remote(...)`` of the class ({} for a plain class)."""
        if self.actor_cls is None:
            return {}
        return dict(self.actor_cls._default_options.get("runtime_env") or {})  # Ray keeps ray.remote's options there


def check_device_name(group: str, device_name: str, use_gpu: bool) -> None:
    """verl's ``device_name`` of a worker group: ``"cuda"``, or ``"cpu"`` for a pool without GPUs."""
    if device_name not in ("cuda", "cpu") or (device_name == "cpu" and use_gpu):
        raise ProtocolError(
            f"worker group '{group}': device_name={device_name!r} is not supported with use_gpu={use_gpu}; "
            "use 'cuda' (GPU bundles) or 'cpu' (a use_gpu=False pool)"
        )


def with_worker_env(group: str, system_env: dict[str, str], protected: Iterable[str],
                    *user_envs: Mapping[str, str] | None) -> dict[str, str]:
    """``system_env`` (what the group sets in each worker) plus the user's variables.

    Args:
        group: group name for the error message.
        system_env: the group's variables of one worker (rank, world size, rendezvous, ...).
        protected: every variable the group sets in some worker (a user value for one of them raises,
            as in verl: ``ValueError`` naming the variables).
        user_envs: the user's variables (``worker_env=`` of the group, the ``env_vars`` of the worker
            class's ``ray.remote(runtime_env=...)``), later ones winning.
    """
    user: dict[str, str] = {}
    for env in user_envs:
        user.update({str(k): str(v) for k, v in (env or {}).items()})
    conflicts = sorted(set(user) & set(protected))
    if conflicts:
        raise ProtocolError(
            f"worker group '{group}': cannot override protected system env {conflicts}: the group sets them in "
            "every worker (rank, world size, rendezvous); remove them from worker_env / the worker class's "
            "runtime_env env_vars"
        )
    return {**system_env, **user}


def materialize(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Resolve ``WorkerFuture`` and ``DataProtoFuture`` arguments to their values."""

    def value(v: Any) -> Any:
        return v.get() if isinstance(v, (WorkerFuture, DataProtoFuture)) else v

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
        self._dispatch_info: dict[str, list[int]] = {}  # mesh -> dp rank of each worker (nd dispatch)
        self._collect_info: dict[str, list[bool]] = {}  # mesh -> whether each worker's output is collected

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
                    raise ProtocolTypeError(
                        f"{user_cls.__name__}.{name}: a registered method may not be called {public!r}, "
                        "which is a WorkerGroup attribute; rename the method"
                    )
                setattr(self, public, self._make_proxy(public, name, spec))

    def _make_proxy(self, public: str, remote: str, spec: RegisterSpec) -> Callable:
        """The group method: materialise futures, dispatch, execute; wait and collect unless non-blocking."""
        dispatch_fn, collect_fn = resolve_dispatch(spec.dispatch_mode)
        mode = spec.dispatch_mode if isinstance(spec.dispatch_mode, Dispatch) else None  # None: a custom dict
        returns_proto = mode in PROTO_MODES and spec.execute_mode is Execute.ALL

        def proxy(*args: Any, _timeout_s: float | None = None, **kwargs: Any) -> Any:
            if spec.materialize_futures:
                args, kwargs = materialize(args, kwargs)
            if mode not in RANK_INFO_MODES:
                self._rank_infos = None  # the call may change the workers' rank_info
            future = self._call(remote, dispatch_fn, collect_fn, spec.execute_mode, args, kwargs, _timeout_s)
            if spec.blocking:
                return future.get()
            return DataProtoFuture(collect_fn=future.finish, futures=future) if returns_proto else future

        proxy.__name__ = public
        return proxy

    def _call(
        self,
        method: str,
        dispatch_fn: Callable,
        collect_fn: Callable,
        execute_mode: Execute,
        args: tuple,
        kwargs: dict,
        timeout_s: float | None,
    ) -> WorkerFuture:
        """Dispatch -> execute; the returned future waits, collects and drops the dispatch padding."""
        self._check_usable(method)
        split_args, split_kwargs = dispatch_fn(self, *args, **kwargs)
        split_kwargs = dict(split_kwargs)
        pad = split_kwargs.pop(PADDING_SIZE_KEY, 0)
        if execute_mode is Execute.ALL:
            ranks = list(range(self.world_size))
            per_rank = [_rank_slice(method, split_args, split_kwargs, rank, len(ranks)) for rank in ranks]
        else:  # rank 0 gets the dispatched arguments as they are
            ranks, per_rank = [0], [(tuple(split_args), split_kwargs)]
        handles = [self._submit(rank, method, *call) for rank, call in zip(ranks, per_rank, strict=True)]

        def finish(outputs: list) -> Any:
            result = collect_fn(self, outputs) if execute_mode is Execute.ALL else outputs[0]
            return unpad_dataproto(result, pad) if pad and isinstance(result, DataProto) else result

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

    def execute_all_async(self, method_name: str, *args: Any, **kwargs: Any) -> WorkerFuture:
        """Run ``method_name`` on every rank (a future of the list of outputs). When every argument is
        a list of ``world_size`` items, rank i gets item i of each; otherwise every rank gets them all."""
        method = method_name
        self._check_usable(method)
        n = self.world_size
        values = [*args, *kwargs.values()]
        if all(isinstance(v, list) and len(v) == n for v in values):
            per_rank_args, per_rank_kwargs = args, kwargs
        else:
            per_rank_args, per_rank_kwargs = tuple([a] * n for a in args), {k: [v] * n for k, v in kwargs.items()}
        ranks = list(range(n))
        handles = [self._submit(r, method, *_rank_slice(method, per_rank_args, per_rank_kwargs, r, n)) for r in ranks]
        return WorkerFuture(self, method, ranks, handles, lambda outputs: outputs, self.call_timeout_s)

    def execute_all_sync(self, method_name: str, *args: Any, **kwargs: Any) -> list:
        return self.execute_all_async(method_name, *args, **kwargs).get()

    def execute_rank_zero_async(self, method_name: str, *args: Any, **kwargs: Any) -> WorkerFuture:
        """Run ``method_name`` on rank 0 (a future of its output)."""
        self._check_usable(method_name)
        handle = self._submit(0, method_name, args, kwargs)
        return WorkerFuture(self, method_name, [0], [handle], lambda outputs: outputs[0], self.call_timeout_s)

    def execute_rank_zero_sync(self, method_name: str, *args: Any, **kwargs: Any) -> Any:
        return self.execute_rank_zero_async(method_name, *args, **kwargs).get()

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
                raise ProtocolKeyError(f"worker group '{self.name}' has no role {role!r}; roles: {sorted(role_classes)}")
            group = copy.copy(self)
            group.name = f"{self.name}/{role}"
            group._method_prefix = f"{role}_"
            group._rank_infos = None
            group._dispatch_info, group._collect_info = {}, {}
            group._bind_worker_methods(self._worker_cls, prefix=f"{role}_")
            groups[role] = group
        return groups

    def fuse(self, prefixes: Iterable[str]) -> None:
        """verl's fused workers: for each role of a colocated group (a class made by
        ``create_colocated_worker_raw_cls``, or a subclass of it), the group of that role
        (:meth:`spawn`) as an attribute, ``group.actor.add(x)``.

        Raises:
            ProtocolKeyError: a role the colocated class does not have.
            ProtocolTypeError: a role's name is taken by an attribute of the group.
        """
        for role, group in self.spawn(list(prefixes)).items():
            if role in dir(self):
                raise ProtocolTypeError(f"worker group '{self.name}': role {role!r} is also an attribute of the "
                                        "group; rename the role")
            setattr(self, role, group)

    def _worker_cls_role_classes(self) -> dict[str, type]:
        roles = getattr(self._worker_cls, "raw_cls_dict", None)  # the fused class or a subclass of it
        if roles is None:
            raise ProtocolTypeError(
                f"worker group '{self.name}' runs {self._worker_cls.__name__}, not a colocated class; "
                "build the class with create_colocated_worker_cls to use spawn()"
            )
        return roles


def _rank_slice(method: str, args: tuple[list, ...], kwargs: dict[str, list], rank: int, n: int) -> tuple[tuple, dict]:
    """The arguments of ``rank`` from per-rank argument lists (each must have ``n`` items)."""
    for name, value in [*enumerate(args), *kwargs.items()]:
        if not isinstance(value, list | tuple) or len(value) != n:
            raise ProtocolError(
                f"'{method}': the dispatch function must give every argument as a list of one item per rank "
                f"({n}); argument {name!r} is {type(value).__name__}"
            )
    return tuple(a[rank] for a in args), {k: v[rank] for k, v in kwargs.items()}


def _check_dp_layout(group: str, infos: list[RankInfo]) -> None:
    """Every dp rank in ``0..dp_size-1`` has exactly one collecting worker."""
    dp_size = infos[0].dp_size
    collect = sorted(info.dp_rank for info in infos if info.is_collect)
    if any(info.dp_size != dp_size for info in infos) or collect != list(range(dp_size)):
        layout = [(i.rank, i.dp_rank, i.dp_size, i.tp_rank) for i in infos]
        raise ProtocolError(
            f"worker group '{group}': inconsistent rank_info (rank, dp_rank, dp_size, tp_rank) = {layout}; "
            "every dp_rank in 0..dp_size-1 needs exactly one worker with tp_rank 0"
        )
