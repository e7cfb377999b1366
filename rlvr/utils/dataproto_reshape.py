"""Functions that build a new :class:`rlvr.protocol.DataProto` from the rows of others: joining
rows, padding, folding rows into groups and back, splitting columns into rows, collating items and
converting to / from a flat ``TensorDict``.

They take and return DataProtos (of the caller's class, ``type(data)``) and never modify their
input. ``rlvr.protocol`` re-exports the public ones at verl's names.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict
from torch.utils.data import DataLoader

from rlvr.utils.dataproto_ops import to_object_array
from rlvr.utils.errors import ProtocolError, ProtocolKeyError, ProtocolTypeError

if TYPE_CHECKING:
    from rlvr.protocol import DataProto, DataProtoItem

__all__ = [
    "cat_rows",
    "pad_dataproto_to_divisor",
    "unpad_dataproto",
    "fold_batch_dim",
    "unfold_batch_dim",
    "unfold_column_chunks",
    "list_of_dict_to_dict_of_list",
    "collate_fn",
    "iterate_mini_batches",
    "to_tensordict",
    "from_tensordict",
]


def cat_rows(data: Sequence[DataProto], meta_info: dict[str, Any]) -> DataProto:
    """Concatenate the rows of ``data`` (same keys and dtypes required) with the given meta_info.

    Raises:
        ProtocolKeyError: the parts have different tensor or non-tensor keys.
        ProtocolError: some parts have tensors and some none, or a tensor's dtype differs.
    """
    first = data[0]
    has_batch = [d.batch is not None for d in data]
    if any(has_batch) and not all(has_batch):
        raise ProtocolError("cannot concat: some DataProtos have tensors and some have none")
    batch = None
    if first.batch is not None:
        keys = sorted(first.batch.keys())
        for i, d in enumerate(data[1:], start=1):
            if sorted(d.batch.keys()) != keys:
                raise ProtocolKeyError(
                    f"cannot concat: part {i} has tensor keys {sorted(d.batch.keys())}, part 0 has {keys}"
                )
            for key in keys:
                if d.batch[key].dtype != first.batch[key].dtype:
                    raise ProtocolError(
                        f"cannot concat: tensor '{key}' is {d.batch[key].dtype} in part {i} "
                        f"but {first.batch[key].dtype} in part 0"
                    )
        batch = torch.cat([d.batch for d in data], dim=0)
    keys = sorted(first.non_tensor_batch)
    for i, d in enumerate(data[1:], start=1):
        if sorted(d.non_tensor_batch) != keys:
            raise ProtocolKeyError(
                f"cannot concat: part {i} has non-tensor keys {sorted(d.non_tensor_batch)}, part 0 has {keys}"
            )
    non_tensor = {key: np.concatenate([d.non_tensor_batch[key] for d in data], axis=0) for key in keys}
    return type(first)(batch=batch, non_tensor_batch=non_tensor, meta_info=meta_info)


def pad_dataproto_to_divisor(data: DataProto, size_divisor: int) -> tuple[DataProto, int]:
    """Pad ``data`` so its length is a multiple of ``size_divisor``.

    The padding repeats rows from the start (``0, 1, 2, ...``, wrapping around when more padding
    rows than rows are needed), so padded rows are valid samples.

    Returns:
        ``(padded, pad_size)``; pass ``pad_size`` to :func:`unpad_dataproto` afterwards.
    """
    if size_divisor <= 0:
        raise ProtocolError(f"size_divisor must be positive, got {size_divisor}")
    length = len(data)
    pad_size = (-length) % size_divisor
    if pad_size == 0:
        return data, 0
    if length == 0:
        raise ProtocolError(f"cannot pad an empty DataProto to a multiple of {size_divisor}")
    padding = data.select_idxs(torch.arange(pad_size) % length)
    return cat_rows([data, padding], dict(data.meta_info)), pad_size


def unpad_dataproto(data: DataProto, pad_size: int) -> DataProto:
    """Drop the last ``pad_size`` rows added by :func:`pad_dataproto_to_divisor`."""
    if pad_size < 0 or pad_size > len(data):
        raise ProtocolError(f"pad_size {pad_size} is invalid for a DataProto of length {len(data)}")
    return data.slice(0, len(data) - pad_size) if pad_size else data


def fold_batch_dim(data: DataProto, new_batch_size: int) -> DataProto:
    """Group consecutive rows: every ``[bsz, ...]`` value becomes ``[new_batch_size, bsz // new_batch_size, ...]``.

    Row ``i`` of the result holds rows ``i*k .. i*k + k-1`` of ``data`` (``k = bsz // new_batch_size``);
    :func:`unfold_batch_dim` undoes it.

    Raises:
        ProtocolError: ``new_batch_size`` does not divide the length.
    """
    length = len(data)
    if new_batch_size <= 0 or length % new_batch_size:
        raise ProtocolError(f"cannot fold {length} rows into {new_batch_size} groups of equal size")
    batch = None
    if data.batch is not None:
        tensors = {k: v.reshape(new_batch_size, -1, *v.shape[1:]) for k, v in data.batch.items()}
        batch = TensorDict(tensors, batch_size=[new_batch_size], device=data.batch.device)
    non_tensor = {k: np.reshape(v, (new_batch_size, -1, *v.shape[1:])) for k, v in data.non_tensor_batch.items()}
    return type(data)(batch=batch, non_tensor_batch=non_tensor, meta_info=data.meta_info)


def unfold_batch_dim(data: DataProto, batch_dims: int = 2) -> DataProto:
    """Flatten the first ``batch_dims`` dims of every value into one batch dim (undoes :func:`fold_batch_dim`).

    Raises:
        ProtocolError: the values disagree on their first ``batch_dims`` dims.
    """
    values = [*(data.batch.values() if data.batch is not None else []), *data.non_tensor_batch.values()]
    leading = {tuple(v.shape[:batch_dims]) for v in values}
    if len(leading) > 1 or any(len(shape) < batch_dims for shape in leading):
        raise ProtocolError(f"cannot unfold {batch_dims} batch dims: the values have leading shapes {sorted(leading)}")
    batch = None
    if data.batch is not None:
        tensors = {k: v.reshape(-1, *v.shape[batch_dims:]) for k, v in data.batch.items()}
        rows = next(iter(tensors.values())).shape[0] if tensors else 0
        batch = TensorDict(tensors, batch_size=[rows], device=data.batch.device)
    non_tensor = {k: np.reshape(v, (-1, *v.shape[batch_dims:])) for k, v in data.non_tensor_batch.items()}
    return type(data)(batch=batch, non_tensor_batch=non_tensor, meta_info=data.meta_info)


def _rows_as_columns(value: np.ndarray) -> np.ndarray:
    """A 1-D object array whose items are sequences of one length ``c`` (a column of lists, the
    layout rlvr keeps for nested lists) as the 2-D ``[b, c]`` object array verl would hold; any
    other array as it is."""
    if value.ndim != 1 or value.dtype != object or not len(value):
        return value
    if not all(isinstance(item, (list, tuple, np.ndarray)) for item in value):
        return value
    lengths = {len(item) for item in value}
    if len(lengths) != 1:
        return value
    table = np.empty((len(value), lengths.pop()), dtype=object)
    for row, item in enumerate(value):
        table[row, :] = list(item)
    return table


def _split_columns(value: Any, key: str, n_split: int) -> Any:
    """``[b, c, ...]`` -> ``[b * n_split, c // n_split, ...]``: row r's columns cut into n_split
    consecutive rows. A non-tensor column of equal-length lists ``[b]`` counts as ``[b, c]``."""
    if isinstance(value, np.ndarray):
        value = _rows_as_columns(value)
    if value.ndim < 2 or value.shape[1] % n_split:
        raise ProtocolError(f"cannot split key '{key}' of shape {list(value.shape)} into {n_split} column chunks")
    return value.reshape(value.shape[0] * n_split, value.shape[1] // n_split, *value.shape[2:])


def unfold_column_chunks(data: DataProto, n_split: int, split_keys: Sequence[str] | None = None) -> DataProto:
    """Cut dim 1 of the ``split_keys`` into ``n_split`` chunks that become rows; every other key is
    repeated ``n_split`` times (interleaved), so the result has ``len(data) * n_split`` rows.

    Raises:
        ProtocolKeyError: a split key is not in the DataProto.
        ProtocolError: a split key's dim 1 is not divisible by ``n_split``.
    """
    split = set(split_keys or [])
    known = set(data.non_tensor_batch) | (set(data.batch.keys()) if data.batch is not None else set())
    if split - known:
        raise ProtocolKeyError(f"unfold_column_chunks: no key(s) {sorted(split - known)}; available: {sorted(known)}")
    batch = None
    if data.batch is not None:
        tensors = {
            k: _split_columns(v, k, n_split) if k in split else v.repeat_interleave(n_split, dim=0)
            for k, v in data.batch.items()
        }
        batch = TensorDict(tensors, batch_size=[len(data) * n_split], device=data.batch.device)
    non_tensor = {
        k: _split_columns(v, k, n_split) if k in split else np.repeat(v, n_split, axis=0)
        for k, v in data.non_tensor_batch.items()
    }
    return type(data)(batch=batch, non_tensor_batch=non_tensor, meta_info=data.meta_info)


def list_of_dict_to_dict_of_list(list_of_dict: Sequence[dict]) -> dict[str, list]:
    """``[{a: 1, b: 2}, {a: 3, b: 4}]`` -> ``{a: [1, 3], b: [2, 4]}`` (every dict needs the same keys).

    Raises:
        ProtocolKeyError: a dict has other keys than the first.
    """
    if not list_of_dict:
        return {}
    keys = list(list_of_dict[0])
    for i, d in enumerate(list_of_dict):
        if sorted(d) != sorted(keys):
            raise ProtocolKeyError(f"dict {i} has keys {sorted(d)}, dict 0 has {sorted(keys)}")
    return {key: [d[key] for d in list_of_dict] for key in keys}


def collate_fn(x: Sequence[DataProtoItem]) -> DataProto:
    """Stack single rows ``x`` (``DataProtoItem``s) back into a DataProto (the collate function of
    :meth:`DataProto.make_iterator`); non-tensor values become 1-D object arrays."""
    from rlvr.protocol import DataProto

    tensors = [item.batch for item in x]
    batch = torch.stack(tensors).contiguous() if tensors and tensors[0] is not None else None
    columns = list_of_dict_to_dict_of_list([item.non_tensor_batch for item in x])
    return DataProto(batch=batch, non_tensor_batch={k: to_object_array(v) for k, v in columns.items()})


def iterate_mini_batches(
    data: DataProto, mini_batch_size: int, epochs: int, seed: int | None, dataloader_kwargs: dict | None
) -> Iterator[DataProto]:
    """Mini-batches of ``data`` for ``epochs`` epochs through a ``DataLoader`` over its rows (see
    :meth:`DataProto.make_iterator`); each carries a copy of ``data.meta_info``.

    Raises:
        ProtocolError: ``mini_batch_size`` does not divide the length.
    """
    if mini_batch_size <= 0 or len(data) % mini_batch_size:
        raise ProtocolError(f"mini_batch_size {mini_batch_size} must divide the DataProto's length {len(data)}")
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    loader = DataLoader(data, batch_size=mini_batch_size, collate_fn=collate_fn, generator=generator,
                        **(dataloader_kwargs or {}))

    def batches() -> Iterator[DataProto]:
        for _ in range(epochs):
            for mini_batch in loader:
                mini_batch.meta_info = dict(data.meta_info)
                yield mini_batch

    return batches()


def to_tensordict(data: DataProto) -> TensorDict:
    """One ``TensorDict [batch]``: the tensors, each non-tensor column as a ``NonTensorStack`` of its
    rows, and each ``meta_info`` entry as ``NonTensorData``.

    Raises:
        ProtocolKeyError: a key is used by two of the three parts.
    """
    parts = {
        "batch": list(data.batch.keys()) if data.batch is not None else [],
        "non_tensor_batch": list(data.non_tensor_batch),
        "meta_info": list(data.meta_info),
    }
    owner: dict[str, str] = {}
    for part, keys in parts.items():
        for key in keys:
            if key in owner:
                raise ProtocolKeyError(f"to_tensordict: key '{key}' is in both {owner[key]} and {part}; rename one")
            owner[key] = part
    out = data.batch.copy() if data.batch is not None else TensorDict({}, batch_size=[len(data)])
    for key, column in data.non_tensor_batch.items():
        out[key] = NonTensorStack.from_list([NonTensorData(value) for value in column])
    for key, value in data.meta_info.items():
        out.set_non_tensor(key, value)
    return out


def from_tensordict(
    cls: type[DataProto], tensor_dict: TensorDict, meta_info: dict | None = None, num_batch_dims: int = 1
) -> DataProto:
    """The inverse of :func:`to_tensordict`: tensors -> ``batch``, ``NonTensorStack`` -> a 1-D object
    column of ``non_tensor_batch``, ``NonTensorData`` -> ``meta_info``.

    Raises:
        ProtocolError: ``num_batch_dims`` is not 1 (a DataProto has one batch dim).
        ProtocolTypeError: ``tensor_dict`` is not a TensorDict or holds a value of another kind.
    """
    if num_batch_dims != 1:
        raise ProtocolError(f"a DataProto has one batch dim; num_batch_dims={num_batch_dims} is not supported")
    if not isinstance(tensor_dict, TensorDict):
        raise ProtocolTypeError(f"from_tensordict needs a TensorDict, got {type(tensor_dict).__name__}")
    tensors, non_tensors, meta = {}, {}, dict(meta_info or {})
    for key, value in tensor_dict.items():
        if isinstance(value, NonTensorStack):
            non_tensors[key] = to_object_array(value.tolist())
        elif isinstance(value, NonTensorData):
            meta[key] = value.data
        elif isinstance(value, (torch.Tensor, TensorDict)):
            tensors[key] = value
        else:
            raise ProtocolTypeError(f"from_tensordict: key '{key}' holds a {type(value).__name__}")
    batch = TensorDict(tensors, batch_size=tensor_dict.batch_size[:1]) if tensors else None
    return cls(batch=batch, non_tensor_batch=non_tensors, meta_info=meta)
