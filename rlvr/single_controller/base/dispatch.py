"""The dispatch and collect functions of the predefined ``Dispatch`` modes (verl's names).

A dispatch function ``(worker_group, *args, **kwargs) -> (args, kwargs)`` returns, for every
argument, a list with one entry per rank. A DataProto dispatch pads its DataProto arguments to a
multiple of the number of parts (see ``DataProtoConfig``: always by default, or only with auto
padding as in verl) and reports the padding under ``PADDING_SIZE_KEY`` in the returned kwargs; the
worker group pops it and drops the padding rows from the collected DataProto.

A collect function ``(worker_group, outputs) -> result`` merges the per-rank outputs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tensordict import TensorDict

from rlvr.protocol import DataProto, DataProtoConfig, DataProtoFuture
from rlvr.utils import tensordict_utils as tu
from rlvr.utils.errors import ProtocolError, ProtocolTypeError

if TYPE_CHECKING:
    from rlvr.single_controller.base.worker_group import WorkerGroup

PADDING_SIZE_KEY = "_rlvr_padding_size"

__all__ = [
    "PADDING_SIZE_KEY",
    "dispatch_one_to_all",
    "dispatch_all_to_all",
    "collect_all_to_all",
    "dispatch_dp_compute",
    "collect_dp_compute",
    "dispatch_dp_compute_data_proto",
    "dispatch_dp_compute_data_proto_with_func",
    "collect_dp_compute_data_proto",
    "dispatch_dp_mp_compute",
    "dispatch_dp_mp_dispatch_first",
    "collect_dp_mp_compute",
    "dispatch_nd_compute_dataproto",
    "collect_nd_compute_dataproto",
    "dispatch_lazy_compute_data_proto",
    "collect_lazy_compute_data_proto",
]


def dispatch_one_to_all(worker_group: WorkerGroup, *args: Any, **kwargs: Any):
    """Every rank gets the same arguments."""
    n = worker_group.world_size
    return tuple([a] * n for a in args), {k: [v] * n for k, v in kwargs.items()}


def dispatch_all_to_all(worker_group: WorkerGroup, *args: Any, **kwargs: Any):
    """The arguments are already per rank (lists of ``world_size``); with ``Execute.RANK_ZERO`` they
    reach rank 0 as they are."""
    return args, kwargs


def collect_all_to_all(worker_group: WorkerGroup, output: list) -> list:
    """The list of per-rank outputs."""
    return output


def dispatch_dp_compute(worker_group: WorkerGroup, *args: Any, **kwargs: Any):
    """Like ``ALL_TO_ALL``, after checking that every argument is a list with one item per rank."""
    for name, value in [*enumerate(args), *kwargs.items()]:
        if not isinstance(value, list | tuple) or len(value) != worker_group.world_size:
            raise ProtocolTypeError(
                f"Dispatch.DP_COMPUTE needs every argument to be a list with one item per rank "
                f"({worker_group.world_size}); argument {name!r} is {type(value).__name__}"
                f"{f' of length {len(value)}' if isinstance(value, list | tuple) else ''}"
            )
    return args, kwargs


def collect_dp_compute(worker_group: WorkerGroup, output: list) -> list:
    """The list of per-rank outputs (one per rank)."""
    if len(output) != worker_group.world_size:
        raise ProtocolError(f"expected one output per rank ({worker_group.world_size}), got {len(output)}")
    return output


def _padded(data: DataProto, pad_size: int) -> DataProto:
    """A copy of ``data`` with ``pad_size`` copies of its last row appended (``data`` is unchanged)."""
    copy = data.slice()
    copy.padding(pad_size)
    return copy


def _split_data(chunks: int, args: tuple, kwargs: dict) -> tuple[tuple[list, ...], dict[str, list]]:
    """Cut DataProto (and DataProtoFuture) arguments into ``chunks`` parts, TensorDicts into
    ``chunks`` equal parts; other arguments are replicated. DataProtos are padded first when padding
    applies (all must have one length)."""
    lengths = {len(v) for v in (*args, *kwargs.values()) if isinstance(v, DataProto)}
    if len(lengths) > 1:
        raise ProtocolError(f"all DataProto arguments of one call must have the same length, got {sorted(lengths)}")
    pad_size = (-lengths.pop()) % chunks if lengths else 0
    padded_any = False

    def split(value: Any) -> list:
        nonlocal padded_any
        if isinstance(value, DataProto):
            if pad_size and (DataProtoConfig.dispatch_padding or value.is_padding_enabled()):
                value, padded_any = _padded(value, pad_size), True
            return value.chunk(chunks)
        if isinstance(value, DataProtoFuture):
            return value.chunk(chunks)
        if isinstance(value, TensorDict):
            return tu.chunk_tensordict(value, chunks)
        return [value] * chunks

    split_args, split_kwargs = tuple(split(a) for a in args), {k: split(v) for k, v in kwargs.items()}
    if padded_any:
        split_kwargs[PADDING_SIZE_KEY] = pad_size
    return split_args, split_kwargs


def dispatch_dp_compute_data_proto(worker_group: WorkerGroup, *args: Any, **kwargs: Any):
    """Rank r gets part r of every DataProto argument (padded to a multiple of ``world_size``)."""
    return _split_data(worker_group.world_size, args, kwargs)


def dispatch_dp_compute_data_proto_with_func(worker_group: WorkerGroup, func: Callable, *args: Any, **kwargs: Any):
    """Like ``dispatch_dp_compute_data_proto``; the first argument, a function, goes to every rank."""
    if not callable(func):
        raise ProtocolTypeError(f"Dispatch.DP_COMPUTE_PROTO_WITH_FUNC needs a function first, got {func!r}")
    split_args, split_kwargs = _split_data(worker_group.world_size, args, kwargs)
    return ([func] * worker_group.world_size, *split_args), split_kwargs


def _concat(outputs: list, mode: str) -> DataProto:
    for rank, out in enumerate(outputs):
        if not isinstance(out, DataProto):
            raise ProtocolTypeError(
                f"a method registered with Dispatch.{mode} must return a DataProto; "
                f"rank {rank} returned {type(out).__name__}"
            )
    return DataProto.concat(outputs)


def collect_dp_compute_data_proto(worker_group: WorkerGroup, output: list) -> DataProto:
    """The per-rank DataProtos concatenated in rank order."""
    return _concat(collect_dp_compute(worker_group, output), "DP_COMPUTE_PROTO")


def _dp_mp_split(worker_group: WorkerGroup, first_only: bool, args: tuple, kwargs: dict):
    """Cut DataProto args into ``dp_size`` parts; rank r gets the part of its ``dp_rank``
    (``first_only``: only ranks with ``tp_rank == 0``, the others ``None``)."""
    infos = worker_group.rank_infos()
    parts_args, parts_kwargs = _split_data(infos[0].dp_size, args, kwargs)
    pad = parts_kwargs.pop(PADDING_SIZE_KEY, None)

    def per_rank(parts: list) -> list:
        return [None if first_only and info.tp_rank != 0 else parts[info.dp_rank] for info in infos]

    split_kwargs = {k: per_rank(p) for k, p in parts_kwargs.items()}
    if pad is not None:
        split_kwargs[PADDING_SIZE_KEY] = pad
    return tuple(per_rank(p) for p in parts_args), split_kwargs


def dispatch_dp_mp_compute(worker_group: WorkerGroup, *args: Any, **kwargs: Any):
    """Part ``dp_rank`` of ``dp_size`` to every rank, replicated over the model-parallel ranks."""
    return _dp_mp_split(worker_group, False, args, kwargs)


def dispatch_dp_mp_dispatch_first(worker_group: WorkerGroup, *args: Any, **kwargs: Any):
    """Like ``dispatch_dp_mp_compute``, but only ranks with ``tp_rank == 0`` get data (others ``None``)."""
    return _dp_mp_split(worker_group, True, args, kwargs)


def collect_dp_mp_compute(worker_group: WorkerGroup, output: list) -> DataProto | list:
    """Outputs of the collecting rank of each dp group, in dp-rank order (concatenated if DataProto)."""
    infos = worker_group.rank_infos()
    picked = sorted((info.dp_rank, out) for info, out in zip(infos, output, strict=True) if info.is_collect)
    results = [out for _, out in picked]
    if all(isinstance(out, DataProto) for out in results):
        return DataProto.concat(results)
    return results


def dispatch_nd_compute_dataproto(dp_rank_mapping: list[int], dp_size: int, worker_group: WorkerGroup,
                                  *args: Any, **kwargs: Any):
    """DataProto / TensorDict arguments cut into ``dp_size`` parts; worker ``r`` gets part
    ``dp_rank_mapping[r]`` (other arguments go to every worker)."""
    if len(dp_rank_mapping) != worker_group.world_size:
        raise ProtocolError(f"dp_rank_mapping has {len(dp_rank_mapping)} entries for {worker_group.world_size} workers")
    parts_args, parts_kwargs = _split_data(dp_size, args, kwargs)
    pad = parts_kwargs.pop(PADDING_SIZE_KEY, None)
    split_kwargs = {key: [parts[r] for r in dp_rank_mapping] for key, parts in parts_kwargs.items()}
    if pad is not None:
        split_kwargs[PADDING_SIZE_KEY] = pad
    return tuple([parts[r] for r in dp_rank_mapping] for parts in parts_args), split_kwargs


def collect_nd_compute_dataproto(collect_mask: list[bool], worker_group: WorkerGroup, output: list) -> Any:
    """The outputs of the workers whose ``collect_mask`` is set, in rank order, concatenated
    (DataProtos, TensorDicts) or as a list."""
    if len(output) != worker_group.world_size or len(collect_mask) != worker_group.world_size:
        raise ProtocolError(f"{len(output)} outputs and {len(collect_mask)} collect flags for "
                            f"{worker_group.world_size} workers")
    kept = [out for out, keep in zip(output, collect_mask) if keep]
    if kept and all(isinstance(out, DataProto) for out in kept):
        return DataProto.concat(kept)
    if kept and all(isinstance(out, TensorDict) for out in kept):
        return tu.concat_tensordict(kept)
    return kept


def dispatch_lazy_compute_data_proto(mesh_name: str, worker_group: WorkerGroup, *args: Any, **kwargs: Any):
    """:func:`dispatch_nd_compute_dataproto` with the dp ranks the workers registered for
    ``mesh_name`` (``Worker._register_dispatch_collect_info``), asked once per group."""
    if mesh_name not in worker_group._dispatch_info:
        mapping = worker_group._query_dispatch_info(mesh_name)
        if len(mapping) != worker_group.world_size:
            raise ProtocolError(f"{len(mapping)} workers answered the dispatch info of {mesh_name!r}, expected "
                                f"{worker_group.world_size}")
        worker_group._dispatch_info[mesh_name] = list(mapping)
    mapping = worker_group._dispatch_info[mesh_name]
    return dispatch_nd_compute_dataproto(mapping, max(mapping) + 1, worker_group, *args, **kwargs)


def collect_lazy_compute_data_proto(mesh_name: str, worker_group: WorkerGroup, output: list) -> Any:
    """:func:`collect_nd_compute_dataproto` with the collect flags the workers registered for ``mesh_name``."""
    if mesh_name not in worker_group._collect_info:
        worker_group._collect_info[mesh_name] = list(worker_group._query_collect_info(mesh_name))
    return collect_nd_compute_dataproto(worker_group._collect_info[mesh_name], worker_group, output)
