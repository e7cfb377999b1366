"""``@register``: how a worker method is split across ranks, executed and gathered.

The driver never calls a worker method directly. ``WorkerGroup`` binds every method decorated with
``@register`` to a proxy that runs four steps (see ``docs/single_controller.md``)::

    dispatch  (split / replicate the arguments, one slice per rank)
    execute   (call the method on all ranks or on rank 0, each call with a timeout)
    materialise (wait for the results; remote errors become ``WorkerError``)
    collect   (merge the per-rank results into one value)

This module holds the dispatch and collect functions of every ``Dispatch`` mode. They are plain
functions of the worker group, shared by the Ray and the local backend.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

import torch

from rlvr.protocol import DataProto

if TYPE_CHECKING:
    from rlvr.single_controller.base.worker_group import WorkerGroup

REGISTER_ATTR = "_rlvr_register"


class Dispatch(Enum):
    """How the arguments of a call are distributed over the ranks of a worker group."""

    ONE_TO_ALL = "one_to_all"  # every rank gets the same arguments; returns a list, one per rank
    ALL_TO_ALL = "all_to_all"  # arguments are lists of length world_size; rank i gets item i
    RANK_ZERO = "rank_zero"  # runs on rank 0 only and returns its output
    DP_COMPUTE = "dp_compute"  # like ALL_TO_ALL, but checks the list lengths
    DP_COMPUTE_PROTO = "dp_compute_proto"  # DataProto split over ranks (padded), results concatenated
    DP_COMPUTE_PROTO_WITH_FUNC = "dp_compute_proto_with_func"  # same, first argument is a function
    DP_MP_COMPUTE = "dp_mp_compute"  # split by dp rank, replicated over model-parallel ranks
    DP_MP_DISPATCH_FIRST = "dp_mp_dispatch_first"  # split by dp rank, sent to tp_rank 0 only


class Execute(Enum):
    """Which ranks run the method."""

    ALL = "all"
    RANK_ZERO = "rank_zero"


DispatchFn = Callable[..., tuple[tuple[list, ...], dict[str, list]]]
CollectFn = Callable[["WorkerGroup", list], Any]


@dataclass(frozen=True)
class DispatchSpec:
    """The dispatch and collect functions of one mode.

    Attributes:
        dispatch_fn: ``(group, *args, **kwargs) -> (args, kwargs)`` where every positional argument
            and every keyword value is a list with one entry per rank.
        collect_fn: ``(group, outputs) -> result`` with ``outputs`` one entry per executed rank.
        pad_divisor: for the DataProto modes, ``group -> k``: DataProto arguments are padded to a
            multiple of ``k`` before dispatch and the collected DataProto is unpadded.
        uses_rank_info: the mode reads the workers' ``rank_info`` (dp / tp layout).
    """

    dispatch_fn: DispatchFn
    collect_fn: CollectFn
    pad_divisor: Callable[[WorkerGroup], int] | None = None
    uses_rank_info: bool = False


@dataclass(frozen=True)
class RegisterSpec:
    """What ``@register`` records on a worker method."""

    dispatch_mode: Dispatch | dict
    execute_mode: Execute
    blocking: bool
    materialize_futures: bool
    clear_cache: bool


def empty_accelerator_cache() -> None:
    """Give cached accelerator memory back to the device (no-op on CPU or before CUDA starts)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def register(
    dispatch_mode: Dispatch | dict = Dispatch.ALL_TO_ALL,
    execute_mode: Execute = Execute.ALL,
    blocking: bool = True,
    materialize_futures: bool = True,
    clear_cache: bool = True,
) -> Callable:
    """Mark a worker method as callable from the driver through a ``WorkerGroup``.

    Args:
        dispatch_mode: a ``Dispatch`` mode or ``{"dispatch_fn": f, "collect_fn": g}`` (see
            ``DispatchSpec`` for their signatures). ``Dispatch.RANK_ZERO`` implies
            ``Execute.RANK_ZERO``.
        execute_mode: run on all ranks or on rank 0 only; with ``Execute.RANK_ZERO`` the call
            returns rank 0's output as is.
        blocking: the proxy waits for the result; ``False`` returns a ``WorkerFuture``.
        materialize_futures: ``WorkerFuture`` arguments are resolved before dispatch.
        clear_cache: free the accelerator cache in the worker after the method returns.
    """
    resolve_dispatch(dispatch_mode)
    if not isinstance(execute_mode, Execute):
        raise TypeError(f"execute_mode must be an Execute member, got {execute_mode!r}")
    if dispatch_mode is Dispatch.RANK_ZERO:
        execute_mode = Execute.RANK_ZERO
    spec = RegisterSpec(dispatch_mode, execute_mode, blocking, materialize_futures, clear_cache)

    def decorator(func: Callable) -> Callable:
        @functools.wraps(func)
        def inner(*args: Any, **kwargs: Any) -> Any:
            try:
                return func(*args, **kwargs)
            finally:
                if clear_cache:
                    empty_accelerator_cache()

        setattr(inner, REGISTER_ATTR, spec)
        return inner

    return decorator


def registered_methods(cls: type) -> dict[str, RegisterSpec]:
    """Name -> ``RegisterSpec`` of every ``@register``-ed method of ``cls`` (inherited ones too)."""
    found = {}
    for name in dir(cls):
        spec = getattr(getattr(cls, name), REGISTER_ATTR, None)
        if spec is not None:
            found[name] = spec
    return found


# ----------------------------------------------------------------------------- dispatch functions


def _per_rank(n: int, args: tuple, kwargs: dict) -> tuple[tuple[list, ...], dict[str, list]]:
    """Replicate every argument ``n`` times."""
    return tuple([a] * n for a in args), {k: [v] * n for k, v in kwargs.items()}


def dispatch_one_to_all(group: WorkerGroup, *args: Any, **kwargs: Any):
    return _per_rank(group.world_size, args, kwargs)


def dispatch_all_to_all(group: WorkerGroup, *args: Any, **kwargs: Any):
    return args, kwargs


def dispatch_dp_compute(group: WorkerGroup, *args: Any, **kwargs: Any):
    for name, value in [*enumerate(args), *kwargs.items()]:
        if not isinstance(value, list | tuple) or len(value) != group.world_size:
            raise TypeError(
                f"Dispatch.DP_COMPUTE needs every argument to be a list with one item per rank "
                f"({group.world_size}); argument {name!r} is {type(value).__name__}"
                f"{f' of length {len(value)}' if isinstance(value, list | tuple) else ''}"
            )
    return args, kwargs


def _split_protos(n: int, args: tuple, kwargs: dict) -> tuple[tuple[list, ...], dict[str, list]]:
    """Split DataProto arguments into ``n`` equal chunks; other arguments are replicated."""

    def split(value: Any) -> list:
        return value.chunk(n) if isinstance(value, DataProto) else [value] * n

    return tuple(split(a) for a in args), {k: split(v) for k, v in kwargs.items()}


def dispatch_dp_compute_proto(group: WorkerGroup, *args: Any, **kwargs: Any):
    return _split_protos(group.world_size, args, kwargs)


def dispatch_dp_compute_proto_with_func(group: WorkerGroup, func: Callable, *args: Any, **kwargs: Any):
    if not callable(func):
        raise TypeError(f"Dispatch.DP_COMPUTE_PROTO_WITH_FUNC needs a function first, got {func!r}")
    split_args, split_kwargs = _split_protos(group.world_size, args, kwargs)
    return ([func] * group.world_size, *split_args), split_kwargs


def _dp_mp_split(group: WorkerGroup, first_only: bool, args: tuple, kwargs: dict):
    """Chunk DataProto args into ``dp_size`` pieces; rank r gets the piece of its ``dp_rank``."""
    infos = group.rank_infos()
    dp_size = infos[0].dp_size
    chunked_args, chunked_kwargs = _split_protos(dp_size, args, kwargs)

    def per_rank(chunks: list) -> list:
        return [None if first_only and info.tp_rank != 0 else chunks[info.dp_rank] for info in infos]

    return tuple(per_rank(c) for c in chunked_args), {k: per_rank(c) for k, c in chunked_kwargs.items()}


def dispatch_dp_mp_compute(group: WorkerGroup, *args: Any, **kwargs: Any):
    return _dp_mp_split(group, False, args, kwargs)


def dispatch_dp_mp_dispatch_first(group: WorkerGroup, *args: Any, **kwargs: Any):
    return _dp_mp_split(group, True, args, kwargs)


# ------------------------------------------------------------------------------ collect functions


def collect_all(group: WorkerGroup, outputs: list) -> list:
    return outputs


def collect_first(group: WorkerGroup, outputs: list) -> Any:
    return outputs[0]


def _concat_protos(outputs: list, mode: str) -> DataProto:
    for rank, out in enumerate(outputs):
        if not isinstance(out, DataProto):
            raise TypeError(
                f"a method registered with Dispatch.{mode} must return a DataProto; "
                f"rank {rank} returned {type(out).__name__}"
            )
    return DataProto.concat(outputs)


def collect_dp_compute_proto(group: WorkerGroup, outputs: list) -> DataProto:
    return _concat_protos(outputs, "DP_COMPUTE_PROTO")


def collect_dp_mp(group: WorkerGroup, outputs: list) -> DataProto | list:
    """Outputs of the collecting rank of each dp group, in dp-rank order (concatenated if DataProto)."""
    infos = group.rank_infos()
    picked = sorted((info.dp_rank, out) for info, out in zip(infos, outputs) if info.is_collect)
    results = [out for _, out in picked]
    if all(isinstance(out, DataProto) for out in results):
        return DataProto.concat(results)
    return results


_PREDEFINED = {
    Dispatch.ONE_TO_ALL: DispatchSpec(dispatch_one_to_all, collect_all),
    Dispatch.ALL_TO_ALL: DispatchSpec(dispatch_all_to_all, collect_all),
    Dispatch.RANK_ZERO: DispatchSpec(dispatch_one_to_all, collect_first),
    Dispatch.DP_COMPUTE: DispatchSpec(dispatch_dp_compute, collect_all),
    Dispatch.DP_COMPUTE_PROTO: DispatchSpec(
        dispatch_dp_compute_proto, collect_dp_compute_proto, pad_divisor=lambda g: g.world_size
    ),
    Dispatch.DP_COMPUTE_PROTO_WITH_FUNC: DispatchSpec(
        dispatch_dp_compute_proto_with_func, collect_dp_compute_proto, pad_divisor=lambda g: g.world_size
    ),
    Dispatch.DP_MP_COMPUTE: DispatchSpec(
        dispatch_dp_mp_compute, collect_dp_mp, pad_divisor=lambda g: g.rank_infos()[0].dp_size, uses_rank_info=True
    ),
    Dispatch.DP_MP_DISPATCH_FIRST: DispatchSpec(
        dispatch_dp_mp_dispatch_first,
        collect_dp_mp,
        pad_divisor=lambda g: g.rank_infos()[0].dp_size,
        uses_rank_info=True,
    ),
}


def resolve_dispatch(dispatch_mode: Dispatch | dict) -> DispatchSpec:
    """The ``DispatchSpec`` of a ``Dispatch`` member or of a custom ``{dispatch_fn, collect_fn}`` dict."""
    if isinstance(dispatch_mode, Dispatch):
        return _PREDEFINED[dispatch_mode]
    if isinstance(dispatch_mode, dict) and set(dispatch_mode) == {"dispatch_fn", "collect_fn"}:
        return DispatchSpec(dispatch_mode["dispatch_fn"], dispatch_mode["collect_fn"])
    raise TypeError(
        f"dispatch_mode must be a Dispatch member or a dict with exactly the keys "
        f"'dispatch_fn' and 'collect_fn', got {dispatch_mode!r}"
    )
