"""``@register``: how a worker method is split across ranks, executed and gathered.

The driver never calls a worker method directly. ``WorkerGroup`` binds every method decorated with
``@register`` to a proxy that runs four steps (see ``docs/single_controller.md``)::

    dispatch  (split / replicate the arguments, one slice per rank)
    execute   (call the method on all ranks or on rank 0, each call with a timeout)
    materialise (wait for the results; remote errors become ``WorkerError``)
    collect   (merge the per-rank results into one value)

A ``Dispatch`` mode names a pair of dispatch / collect functions in ``DISPATCH_MODE_FN_REGISTRY``
(verl's dispatch-mode registry): ``register_dispatch_mode`` adds a mode, ``update_dispatch_mode``
replaces the functions of one. The functions are shared by the Ray and the local backend.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch

from rlvr.single_controller.base import dispatch as fns
from rlvr.single_controller.base.dispatch import (  # verl's names, importable from here as from verl
    collect_all_to_all,
    collect_dp_compute,
    collect_dp_compute_data_proto,
    collect_lazy_compute_data_proto,
    collect_nd_compute_dataproto,
    dispatch_all_to_all,
    dispatch_dp_compute,
    dispatch_dp_compute_data_proto,
    dispatch_dp_compute_data_proto_with_func,
    dispatch_lazy_compute_data_proto,
    dispatch_nd_compute_dataproto,
    dispatch_one_to_all,
)
from rlvr.utils.errors import ProtocolKeyError, ProtocolTypeError
from rlvr.utils.py_functional import DynamicEnum

REGISTER_ATTR = "_rlvr_register"

__all__ = [
    "DISPATCH_MODE_FN_REGISTRY",
    "collect_all_to_all",
    "collect_dp_compute",
    "collect_dp_compute_data_proto",
    "collect_lazy_compute_data_proto",
    "collect_nd_compute_dataproto",
    "dispatch_all_to_all",
    "dispatch_dp_compute",
    "dispatch_dp_compute_data_proto",
    "dispatch_dp_compute_data_proto_with_func",
    "dispatch_lazy_compute_data_proto",
    "dispatch_nd_compute_dataproto",
    "dispatch_one_to_all",
    "Dispatch",
    "Execute",
    "_check_dispatch_mode",
    "_check_execute_mode",
    "RegisterSpec",
    "get_predefined_dispatch_fn",
    "make_nd_compute_dataproto_dispatch_fn",
    "register",
    "register_dispatch_mode",
    "registered_methods",
    "resolve_dispatch",
    "update_dispatch_mode",
]


class Dispatch(DynamicEnum):
    """How the arguments of a call are distributed over the ranks of a worker group (extensible:
    ``register_dispatch_mode``). The predefined modes:

    - ``RANK_ZERO``: the arguments go to rank 0 only, which returns the result;
    - ``ONE_TO_ALL``: every rank gets the same arguments; returns a list, one output per rank;
    - ``ALL_TO_ALL``: arguments are per-rank lists; rank i gets item i (no checks);
    - ``DP_COMPUTE``: like ``ALL_TO_ALL`` but checks the list lengths;
    - ``DP_COMPUTE_PROTO``: each DataProto split over the ranks (padded), results concatenated;
    - ``DP_COMPUTE_PROTO_WITH_FUNC``: the same, the first argument being a function;
    - ``DP_COMPUTE_METRIC``: DataProtos split as ``DP_COMPUTE_PROTO``; returns the list of outputs;
    - ``DP_MP_COMPUTE``: split by ``dp_rank``, replicated over model-parallel ranks (``RankInfo``);
    - ``DP_MP_DISPATCH_FIRST``: the same, data only to ``tp_rank == 0``.
    """


class Execute(Enum):
    """Which ranks run the method."""

    ALL = "all"
    RANK_ZERO = "rank_zero"


_PREDEFINED = {
    "RANK_ZERO": (fns.dispatch_all_to_all, fns.collect_all_to_all),  # run on rank 0 only: no collect
    "ONE_TO_ALL": (fns.dispatch_one_to_all, fns.collect_all_to_all),
    "ALL_TO_ALL": (fns.dispatch_all_to_all, fns.collect_all_to_all),
    "DP_COMPUTE": (fns.dispatch_dp_compute, fns.collect_dp_compute),
    "DP_COMPUTE_PROTO": (fns.dispatch_dp_compute_data_proto, fns.collect_dp_compute_data_proto),
    "DP_COMPUTE_PROTO_WITH_FUNC": (fns.dispatch_dp_compute_data_proto_with_func, fns.collect_dp_compute_data_proto),
    "DP_COMPUTE_METRIC": (fns.dispatch_dp_compute_data_proto, fns.collect_dp_compute),
    "DP_MP_COMPUTE": (fns.dispatch_dp_mp_compute, fns.collect_dp_mp_compute),
    "DP_MP_DISPATCH_FIRST": (fns.dispatch_dp_mp_dispatch_first, fns.collect_dp_mp_compute),
}

DISPATCH_MODE_FN_REGISTRY: dict[Dispatch, dict[str, Callable]] = {
    Dispatch.register(name): {"dispatch_fn": dispatch_fn, "collect_fn": collect_fn}
    for name, (dispatch_fn, collect_fn) in _PREDEFINED.items()
}

# modes whose non-blocking calls return a DataProtoFuture / that read the workers' RankInfo
PROTO_MODES = frozenset(
    Dispatch[name] for name in ("DP_COMPUTE_PROTO", "DP_COMPUTE_PROTO_WITH_FUNC", "DP_MP_COMPUTE", "DP_MP_DISPATCH_FIRST")
)
RANK_INFO_MODES = frozenset((Dispatch.DP_MP_COMPUTE, Dispatch.DP_MP_DISPATCH_FIRST))


def _check_fns(dispatch_fn: Any, collect_fn: Any) -> None:
    if not callable(dispatch_fn) or not callable(collect_fn):
        raise ProtocolTypeError(
            f"dispatch_fn and collect_fn must be callables, got {dispatch_fn!r} and {collect_fn!r}"
        )


def get_predefined_dispatch_fn(dispatch_mode: Dispatch) -> dict[str, Callable]:
    """``{"dispatch_fn": f, "collect_fn": g}`` of a registered mode.

    Raises:
        ProtocolKeyError: the mode has no functions registered.
    """
    if dispatch_mode not in DISPATCH_MODE_FN_REGISTRY:
        raise ProtocolKeyError(
            f"no dispatch functions registered for {dispatch_mode!r}; registered modes: "
            f"{[m.name for m in DISPATCH_MODE_FN_REGISTRY]} (add one with register_dispatch_mode)"
        )
    return DISPATCH_MODE_FN_REGISTRY[dispatch_mode]


def register_dispatch_mode(dispatch_mode_name: str, dispatch_fn: Callable, collect_fn: Callable) -> Dispatch:
    """Add ``Dispatch.<NAME>`` with its dispatch and collect functions and return it.

    Raises:
        ProtocolError: the name is taken (``ValueError`` and ``AssertionError``, as verl raises).
        ProtocolTypeError: a function is not callable.
    """
    _check_fns(dispatch_fn, collect_fn)
    dispatch_mode = Dispatch.register(dispatch_mode_name)
    DISPATCH_MODE_FN_REGISTRY[dispatch_mode] = {"dispatch_fn": dispatch_fn, "collect_fn": collect_fn}
    return dispatch_mode


def update_dispatch_mode(dispatch_mode: Dispatch, dispatch_fn: Callable, collect_fn: Callable) -> None:
    """Replace the dispatch and collect functions of a registered mode (methods bound to a worker
    group afterwards use them; groups already created keep the functions they bound).

    Raises:
        ProtocolTypeError: ``dispatch_mode`` is not a ``Dispatch`` member, or a function is not callable.
        ProtocolKeyError: the mode is not registered.
    """
    if not isinstance(dispatch_mode, Dispatch):
        raise ProtocolTypeError(f"update_dispatch_mode needs a Dispatch member, got {dispatch_mode!r}")
    _check_fns(dispatch_fn, collect_fn)
    get_predefined_dispatch_fn(dispatch_mode)
    DISPATCH_MODE_FN_REGISTRY[dispatch_mode] = {"dispatch_fn": dispatch_fn, "collect_fn": collect_fn}


def _check_dispatch_mode(dispatch_mode: Any) -> None:
    """verl's check of a dispatch mode: a ``Dispatch`` member, or a dict with callable
    ``dispatch_fn`` and ``collect_fn``.

    Raises:
        ProtocolTypeError: (also an ``AssertionError``, as verl asserts) naming what is wrong.
    """
    if isinstance(dispatch_mode, Dispatch):
        return
    if not isinstance(dispatch_mode, dict):
        raise ProtocolTypeError(
            f"dispatch_mode must be a Dispatch or a Dict. Got {dispatch_mode!r}: use a Dispatch member or "
            "{'dispatch_fn': f, 'collect_fn': g}"
        )
    for key in ("dispatch_fn", "collect_fn"):
        if key not in dispatch_mode:
            raise ProtocolTypeError(
                f"key {key} should be in dispatch_mode if it is a dictionary (it has {sorted(dispatch_mode)})"
            )
    _check_fns(dispatch_mode["dispatch_fn"], dispatch_mode["collect_fn"])


def _check_execute_mode(execute_mode: Any) -> None:
    """verl's check of an execute mode: an ``Execute`` member (``ProtocolTypeError`` otherwise)."""
    if not isinstance(execute_mode, Execute):
        raise ProtocolTypeError(f"execute_mode must be a Execute. Got {execute_mode!r}: use Execute.ALL or "
                                "Execute.RANK_ZERO")


def resolve_dispatch(dispatch_mode: Dispatch | dict) -> tuple[Callable, Callable]:
    """``(dispatch_fn, collect_fn)`` of a ``Dispatch`` member or of a ``{dispatch_fn, collect_fn}`` dict.

    Raises:
        ProtocolTypeError: neither, or the dict lacks a callable ``dispatch_fn`` / ``collect_fn``.
        ProtocolKeyError: a ``Dispatch`` member without registered functions.
    """
    _check_dispatch_mode(dispatch_mode)
    if isinstance(dispatch_mode, Dispatch):
        fn = get_predefined_dispatch_fn(dispatch_mode)
        return fn["dispatch_fn"], fn["collect_fn"]
    return dispatch_mode["dispatch_fn"], dispatch_mode["collect_fn"]


def make_nd_compute_dataproto_dispatch_fn(mesh_name: str) -> dict[str, Callable]:
    """A dispatch mode (``@register(dispatch_mode=...)``) that cuts DataProto / TensorDict arguments
    by the data-parallel layout the workers registered for ``mesh_name``
    (``Worker._register_dispatch_collect_info``) and concatenates the outputs of the collecting workers."""
    return {"dispatch_fn": functools.partial(dispatch_lazy_compute_data_proto, mesh_name),
            "collect_fn": functools.partial(collect_lazy_compute_data_proto, mesh_name)}


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
            ``rlvr.single_controller.base.dispatch`` for their signatures). ``Dispatch.RANK_ZERO``
            implies ``Execute.RANK_ZERO``.
        execute_mode: run on all ranks, or on rank 0 only: then rank 0 gets the dispatched
            arguments as they are and the call returns its output.
        blocking: the proxy waits for the result; ``False`` returns a ``DataProtoFuture`` for the
            DataProto modes and a ``WorkerFuture`` otherwise.
        materialize_futures: future arguments are resolved on the driver before dispatch;
            ``False`` passes them on (a ``DataProtoFuture`` split into one future per rank).
        clear_cache: free the accelerator cache in the worker after the method returns.

    An ``async def`` method stays a coroutine function: on Ray the actor awaits it (the actor
    becomes an async actor), the local backend runs it to completion in the calling thread.
    """
    resolve_dispatch(dispatch_mode)
    _check_execute_mode(execute_mode)
    if dispatch_mode is Dispatch.RANK_ZERO:
        execute_mode = Execute.RANK_ZERO
    spec = RegisterSpec(dispatch_mode, execute_mode, blocking, materialize_futures, clear_cache)

    def decorator(func: Callable) -> Callable:
        if inspect.iscoroutinefunction(func):  # an async method stays async: Ray awaits it, the local backend runs it

            @functools.wraps(func)
            async def inner(*args: Any, **kwargs: Any) -> Any:
                try:
                    return await func(*args, **kwargs)
                finally:
                    if clear_cache:
                        empty_accelerator_cache()

        else:

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
