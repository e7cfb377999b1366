"""Pending results of worker calls: ``WorkerFuture`` (any non-blocking worker-group call) and
``DataProtoFuture`` (verl's future of a ``DataProto``, also built from ``ray.ObjectRef``s).

Every wait has a timeout: the call's ``call_timeout_s`` for a worker-group future, else
``RLVR_CALL_TIMEOUT_S`` (default 3600 s) unless ``get(timeout_s=...)`` says otherwise.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlvr.utils.errors import ProtocolTypeError, WorkerError, WorkerTimeoutError

if TYPE_CHECKING:
    from rlvr.protocol import DataProto

__all__ = ["DEFAULT_CALL_TIMEOUT_S", "default_call_timeout_s", "WorkerFuture", "DataProtoFuture"]

DEFAULT_CALL_TIMEOUT_S = 3600.0


def default_call_timeout_s() -> float:
    """Timeout of a remote call: ``RLVR_CALL_TIMEOUT_S`` from the environment, else 3600 s."""
    return float(os.environ.get("RLVR_CALL_TIMEOUT_S", DEFAULT_CALL_TIMEOUT_S))


class WorkerFuture(list):
    """The pending result of a non-blocking worker-group call.

    The future is the list of its per-rank handles (``ray.ObjectRef`` on the Ray backend, so
    ``ray.get(future)`` returns the per-rank outputs as it does for verl's list of refs);
    ``get()`` waits for them with the call's timeout and returns the collected result.

    Args:
        group: the worker group (its ``_wait`` turns remote failures into ``WorkerError``).
        method: the remote method name (for error messages).
        ranks: the rank of each handle.
        handles: one backend handle per executed rank.
        finish: ``outputs -> result`` (the dispatch mode's collect and the unpadding).
        timeout_s: the call's timeout.
    """

    def __init__(
        self, group: Any, method: str, ranks: list[int], handles: list, finish: Callable[[list], Any], timeout_s: float
    ) -> None:
        super().__init__(handles)
        self.group, self.method, self.ranks, self.finish = group, method, ranks, finish
        self._timeout_s = timeout_s
        self._outputs: list | None = None
        self._done, self._value = False, None

    @property
    def handles(self) -> list:
        return list(self)

    def wait(self, timeout_s: float | None = None) -> list:
        """The per-rank outputs; raises ``WorkerError`` / ``WorkerTimeoutError`` / ``WorkerDiedError``."""
        if self._outputs is None:
            self._outputs = self.group._wait(list(self), self.ranks, self.method, timeout_s or self._timeout_s)
        return self._outputs

    def get(self, timeout_s: float | None = None) -> Any:
        """The collected result (waits at most ``timeout_s``, default the call's timeout)."""
        if not self._done:
            self._value, self._done = self.finish(self.wait(timeout_s)), True
        return self._value

    def __deepcopy__(self, memo: dict) -> WorkerFuture:
        return self  # a handle: copies (the local backend copies call arguments) share the one pending call

    def __reduce__(self) -> tuple:
        raise ProtocolTypeError(
            f"the future of '{self.method}' on worker group '{self.group.name}' cannot be sent to another "
            "process; resolve it on the driver with get() (register the receiving method with "
            "materialize_futures=True, the default)"
        )


def _ray_if_loaded() -> Any:
    """The ``ray`` module if this process imported it (a ``ray.ObjectRef`` implies it did)."""
    return sys.modules.get("ray")


def _get_refs(refs: list, timeout_s: float) -> list:
    """``ray.get`` of ``refs`` within ``timeout_s``; failures name the position of the ref."""
    ray = _ray_if_loaded()
    ready, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    if pending:
        late = [i for i, ref in enumerate(refs) if ref in set(pending)]
        raise WorkerTimeoutError(
            "DataProtoFuture", "get", late[0],
            f"ObjectRef(s) {late} of {len(refs)} gave no result within {timeout_s:.1f} s; "
            "pass get(timeout_s=...) to wait longer",
        )
    outputs = []
    for i, ref in enumerate(refs):
        try:
            outputs.append(ray.get(ref))
        except ray.exceptions.RayError as err:
            raise WorkerError("DataProtoFuture", "get", i, str(err)) from None
    return outputs


def _resolve(items: list, timeout_s: float | None) -> list:
    """Values of a verl-style ``futures`` list: ``ray.ObjectRef``s, futures or DataProtos."""
    from rlvr.protocol import DataProto

    ray = _ray_if_loaded()
    values: list[Any] = list(items)
    refs = [i for i, item in enumerate(items) if ray is not None and isinstance(item, ray.ObjectRef)]
    if refs:
        for i, value in zip(refs, _get_refs([items[i] for i in refs], timeout_s or default_call_timeout_s())):
            values[i] = value
    for i, item in enumerate(values):
        if isinstance(item, (WorkerFuture, DataProtoFuture)):
            values[i] = item.get(timeout_s)
        if not isinstance(values[i], DataProto):
            raise ProtocolTypeError(
                f"DataProtoFuture: future {i} resolved to a {type(values[i]).__name__}, expected a DataProto"
            )
    return values


def _select_chunk(data: DataProto, index: int, chunks: int, first: Callable | None) -> DataProto:
    """Part ``index`` of ``chunks`` of ``data`` (after the parent future's own selection ``first``)."""
    return (first(data) if first is not None else data).chunk(chunks)[index]


@dataclass
class DataProtoFuture:
    """A ``DataProto`` still being computed, as verl's non-blocking DataProto calls return it.

    ``get()`` resolves ``futures``, joins them with ``collect_fn`` and applies ``dispatch_fn``
    (the selection of one chunk, after ``chunk``). It can be passed to any worker-group method
    in place of the DataProto: by default the driver resolves it before dispatch.

    Attributes:
        collect_fn: ``outputs -> DataProto`` (``DataProto.concat`` for a list of parts).
        futures: the ``ray.ObjectRef``s (or DataProtos / futures) of the parts; for a worker-group
            call, the call's ``WorkerFuture`` (the list of its per-rank refs).
        dispatch_fn: ``DataProto -> DataProto`` applied last, or None.
    """

    collect_fn: Callable[[list], Any]
    futures: list
    dispatch_fn: Callable[[Any], Any] | None = None

    @staticmethod
    def concat(data: list) -> DataProtoFuture:
        """The future of ``DataProto.concat`` of the parts ``data`` (``ray.ObjectRef``s in verl)."""
        from rlvr.protocol import DataProto

        return DataProtoFuture(collect_fn=DataProto.concat, futures=data)

    def chunk(self, chunks: int) -> list[DataProtoFuture]:
        """``chunks`` futures, the i-th resolving to part i of ``self.get().chunk(chunks)``."""
        return [
            DataProtoFuture(
                self.collect_fn, self.futures, functools.partial(_select_chunk, index=i, chunks=chunks, first=self.dispatch_fn)
            )
            for i in range(chunks)
        ]

    def get(self, timeout_s: float | None = None) -> DataProto:
        """Wait (at most ``timeout_s``; default the call's timeout or ``RLVR_CALL_TIMEOUT_S``) and return the DataProto.

        Raises:
            WorkerError / WorkerTimeoutError: a part failed or did not arrive in time.
            ProtocolTypeError: a part or the result is not a DataProto.
        """
        from rlvr.protocol import DataProto

        if isinstance(self.futures, WorkerFuture):
            outputs = self.futures.wait(timeout_s)
        else:
            outputs = _resolve(self.futures, timeout_s)
        result = self.collect_fn(outputs)
        if self.dispatch_fn is not None:
            result = self.dispatch_fn(result)
        if not isinstance(result, DataProto):
            raise ProtocolTypeError(f"DataProtoFuture resolved to a {type(result).__name__}, expected a DataProto")
        return result
