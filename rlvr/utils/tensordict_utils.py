"""Batches as plain ``TensorDict``s (verl's ``verl.utils.tensordict_utils``): tensors (jagged nested
tensors for packed sequences), per-row Python values as a ``NonTensorStack`` and batch-level values
as ``NonTensorData``, with the operations ``DataProto`` offers on them.

A row-level value is a list (or numpy array) of length batch; a batch-level one is anything else.
Contract violations raise :class:`~rlvr.utils.errors.ProtocolError` (also an ``AssertionError``, as
verl asserts) naming what is wrong.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict
from tensordict.tensorclass import NonTensorData, NonTensorStack

from rlvr.utils.errors import ProtocolError, ProtocolKeyError

__all__ = [
    "assert_tensordict_eq", "assign_non_tensor", "assign_non_tensor_data", "assign_non_tensor_stack",
    "chunk_tensordict", "concat_nested_tensors", "concat_tensordict", "contiguous", "get", "get_keys",
    "get_non_tensor_data", "get_tensordict", "index_select_tensor_dict", "list_of_dict_to_tensordict",
    "make_iterator", "maybe_fix_3d_position_ids", "nested_tensor_from_tensor_list", "pad_to_divisor", "pop",
    "pop_keys", "union_tensor_dict", "unpad", "unwrap_non_tensor_data",
]


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ProtocolError(message)


def _is_nested(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_nested


def _ragged_idx(nested: torch.Tensor) -> int:
    """The ragged dimension of a jagged nested tensor (1 for ``[B, *, ...]``)."""
    return getattr(nested, "_ragged_idx", nested.dim() - 1)


def _plain(value: Any) -> Any:
    """A stored value as Python: a ``NonTensorStack`` as a list, a ``NonTensorData`` as its value."""
    if isinstance(value, NonTensorStack):
        return value.tolist()
    if isinstance(value, NonTensorData):
        return value.data
    return value


# ------------------------------------------------------------------ non-tensor values
def assign_non_tensor_data(tensor_dict: TensorDict, key: str, val: Any) -> None:
    """Store a batch-level value (``NonTensorData``)."""
    _require(isinstance(tensor_dict, TensorDict), f"expected a TensorDict, got {type(tensor_dict).__name__}")
    tensor_dict[key] = NonTensorData(val)


def assign_non_tensor_stack(tensor_dict: TensorDict, key: str, val: list) -> None:
    """Store one Python value per row (lists, dicts, nested lists of dicts) as a ``NonTensorStack``."""
    _require(isinstance(tensor_dict, TensorDict), f"expected a TensorDict, got {type(tensor_dict).__name__}")
    tensor_dict[key] = NonTensorStack.from_list([NonTensorData(item) for item in val])


def assign_non_tensor(tensor_dict: TensorDict, **kwargs: Any) -> TensorDict:
    """Store each keyword: a list per row, anything else (or an already wrapped value) as given."""
    _require(isinstance(tensor_dict, TensorDict), f"expected a TensorDict, got {type(tensor_dict).__name__}")
    for key, val in kwargs.items():
        if isinstance(val, (NonTensorData, NonTensorStack)):
            tensor_dict[key] = val
        elif isinstance(val, list):
            assign_non_tensor_stack(tensor_dict, key, val)
        else:
            assign_non_tensor_data(tensor_dict, key, val)
    return tensor_dict


def unwrap_non_tensor_data(data: Any) -> Any:
    """The value inside a ``NonTensorData``; anything else unchanged."""
    return data.data if isinstance(data, NonTensorData) else data


def get_non_tensor_data(data: TensorDict, key: str, default: Any) -> Any:
    """``data[key]`` unwrapped from ``NonTensorData`` (``default`` when absent)."""
    return unwrap_non_tensor_data(data.get(key, default))


# ------------------------------------------------------------------ nested tensors
def nested_tensor_from_tensor_list(tensors: list[torch.Tensor], ragged_idx: int | None = None) -> torch.Tensor:
    """A jagged nested tensor ``[B, ...]`` of per-row tensors whose sizes differ in dimension
    ``ragged_idx - 1`` (default: their last dimension); e.g. rows ``[4, L_i]`` with ``ragged_idx=2``."""
    _require(len(tensors) > 0, "a nested tensor needs at least one row")
    dims = tensors[0].dim()
    ragged_idx = dims if ragged_idx is None else ragged_idx
    _require(1 <= ragged_idx <= dims, f"ragged_idx must be in [1, {dims}], got {ragged_idx}")
    if dims == 1:
        return torch.nested.as_nested_tensor(tensors, layout=torch.jagged)
    cat_dim = ragged_idx - 1
    values = torch.cat(tensors, dim=cat_dim)
    lengths = torch.tensor([t.shape[cat_dim] for t in tensors], dtype=torch.long, device=values.device)
    offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
    nested = torch.nested.nested_tensor_from_jagged(values=values, offsets=offsets)
    nested._ragged_idx = ragged_idx
    return nested


def _rows(nested: torch.Tensor) -> list[torch.Tensor]:
    """The rows of a jagged nested tensor. ``unbind`` of a 3-D jagged tensor splits the wrong
    dimension of its values in torch (pytorch/pytorch#153238); its rows are then cut from the padded
    tensor by the offsets."""
    try:
        return list(nested.unbind(0))
    except RuntimeError:
        padded = nested.to_padded_tensor(0)
        lengths = nested.offsets().diff().tolist()
        return [padded[i, :length] for i, length in enumerate(lengths)]


def concat_nested_tensors(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Rows of several contiguous jagged nested tensors (2 or more dimensions) in one."""
    rows: list[torch.Tensor] = []
    for tensor in tensors:
        _require(_is_nested(tensor) and tensor.is_contiguous(), "concat_nested_tensors takes contiguous nested tensors")
        _require(tensor.dim() >= 2, f"a nested tensor has 2 or more dimensions, got shape {tensor.shape}")
        rows += _rows(tensor)
    return nested_tensor_from_tensor_list(rows, ragged_idx=_ragged_idx(tensors[0]))


# ------------------------------------------------------------------ construction and comparison
def _batch_len(key: str, val: Any) -> int:
    _require(isinstance(val, (torch.Tensor, list, np.ndarray, NonTensorStack)),
             f"{key} -> {type(val).__name__} is not a torch.Tensor, list or np.ndarray")
    return val.size(0) if isinstance(val, torch.Tensor) else len(val)


def get_tensordict(tensor_dict: dict[str, Any], non_tensor_dict: dict[str, Any] | None = None) -> TensorDict:
    """A TensorDict of row-level values (tensors, jagged nested tensors, lists or arrays with one
    Python value per row) and batch-level ``non_tensor_dict`` values; batch size = the rows.

    Raises:
        ProtocolError: values of different lengths, a list holding tensors (convert them to numpy),
            a nested tensor that is not a contiguous jagged one, a batch-level key that is also a row key.
    """
    source: dict[str, Any] = {}
    batch_size: int | None = None
    for key, val in tensor_dict.items():
        if _is_nested(val):
            _require(val.layout == torch.jagged and val.is_contiguous(),
                     f"{key}: nested tensors must be contiguous and jagged (layout=torch.jagged)")
        if isinstance(val, (list, np.ndarray)):
            _require(not any(isinstance(v, torch.Tensor) for v in val),
                     f"{key}: a list becomes per-row Python values, which cannot hold tensors; convert them to numpy")
            source[key] = NonTensorStack.from_list([NonTensorData(item) for item in val])
        else:
            source[key] = val
        rows = _batch_len(key, val)
        _require(batch_size is None or rows == batch_size,
                 f"{key} has {rows} rows, the other values {batch_size}; every row value needs the same length")
        batch_size = rows
    for key, val in (non_tensor_dict or {}).items():
        _require(key not in source, f"{key} is both a row value and a batch-level value")
        source[key] = NonTensorData(val)
    return TensorDict(source=source, batch_size=[] if batch_size is None else [batch_size])


def list_of_dict_to_tensordict(list_of_dicts: list[dict[str, Any]]) -> TensorDict:
    """A TensorDict of rows given as dicts (the keys of the first): same-shape tensors stacked,
    tensors of different lengths as a jagged nested tensor, anything else per row."""
    _require(len(list_of_dicts) > 0, "list_of_dict_to_tensordict needs at least one row")
    columns = {key: [row[key] for row in list_of_dicts] for key in list_of_dicts[0]}
    source: dict[str, Any] = {}
    for key, values in columns.items():
        if all(isinstance(v, torch.Tensor) for v in values):
            same = all(v.shape == values[0].shape for v in values)
            source[key] = torch.stack(values) if same else torch.nested.as_nested_tensor(values, layout=torch.jagged)
        else:
            source[key] = NonTensorStack(*values)
    return TensorDict(source, batch_size=[len(list_of_dicts)])


def assert_tensordict_eq(tensordict1: TensorDict, tensordict2: TensorDict) -> None:
    """Raise ``AssertionError`` unless both have the same keys and equal values (nested tensors
    row by row, per-row and batch-level values with ``==``)."""
    keys1, keys2 = set(tensordict1.keys()), set(tensordict2.keys())
    _require(keys1 == keys2, f"the keys differ: {sorted(keys1 ^ keys2)}")
    for key in tensordict1.keys():
        a, b = tensordict1[key], tensordict2[key]
        _require(type(a) is type(b), f"{key}: {type(a).__name__} vs {type(b).__name__}")
        if _is_nested(a):
            _require(_is_nested(b), f"{key}: one value is nested, the other not")
            rows_a, rows_b = _rows(a), _rows(b)
            _require(len(rows_a) == len(rows_b), f"{key}: {len(rows_a)} vs {len(rows_b)} rows")
            _require(all(torch.equal(x, y) for x, y in zip(rows_a, rows_b)), f"{key}: the rows differ")
        elif isinstance(a, torch.Tensor):
            _require(torch.equal(a, b), f"{key}: the tensors differ")
        else:
            _require(a == b, f"{key}: {a!r} != {b!r}")


def contiguous(data: TensorDict) -> TensorDict:
    """A new TensorDict with every tensor contiguous (per-row and batch-level values kept; the
    TensorDict's own ``contiguous`` would turn batch-level values into per-row stacks)."""
    rows: dict[str, Any] = {}
    batch: dict[str, Any] = {}
    for key in data.keys():
        val = data.get(key)
        if isinstance(val, NonTensorData):
            batch[key] = val.data
        elif isinstance(val, NonTensorStack):
            rows[key] = val
        else:
            _require(isinstance(val, torch.Tensor), f"{key}: expected a tensor, got {type(val).__name__}")
            rows[key] = val.contiguous()
    return get_tensordict(rows, batch)


def maybe_fix_3d_position_ids(data: TensorDict) -> None:
    """Restore the ragged dimension of 3-D nested ``position_ids`` (M-RoPE), which a pickle round
    trip of a consolidated TensorDict loses."""
    if "position_ids" in data.keys() and data["position_ids"].dim() == 3 and data["position_ids"].is_nested:
        data["position_ids"]._ragged_idx = 2


# ------------------------------------------------------------------ selection, splitting, merging
def index_select_tensor_dict(batch: TensorDict | None, indices: torch.Tensor | list[int]) -> TensorDict | None:
    """The rows ``indices`` (1-D) of ``batch``; batch-level values are kept; None for None."""
    indices = torch.as_tensor(indices)
    _require(indices.dim() == 1, f"indices must be 1-D, got shape {tuple(indices.shape)}")
    if batch is None:
        return None
    selected: dict[str, Any] = {}
    for key, val in batch.items():
        if _is_nested(val):
            rows = _rows(val)
            selected[key] = nested_tensor_from_tensor_list([rows[i] for i in indices.tolist()], _ragged_idx(val))
        elif isinstance(val, torch.Tensor) or val.shape:
            selected[key] = val[indices]
        else:
            selected[key] = val
    return TensorDict(source=selected, batch_size=indices.shape[0])


def chunk_tensordict(td: TensorDict, chunks: int) -> list[TensorDict]:
    """``chunks`` TensorDicts of equal length (nested tensors split by rows, which
    ``TensorDict.chunk`` cannot do)."""
    _require(isinstance(td, TensorDict) and len(td) % chunks == 0,
             f"cannot cut {len(td)} rows into {chunks} equal chunks")
    size = len(td) // chunks
    nested = [key for key, val in td.items() if _is_nested(val)]
    parts = TensorDict({k: v for k, v in td.items() if k not in nested}, batch_size=td.batch_size,
                       device=td.device).chunk(chunks=chunks)
    for key in nested:
        rows = _rows(td[key])
        for i, part in enumerate(parts):
            part[key] = nested_tensor_from_tensor_list(rows[i * size:(i + 1) * size], _ragged_idx(td[key]))
    return list(parts)


def concat_tensordict(data: list[TensorDict]) -> TensorDict:
    """The rows of several TensorDicts with the same keys in one; batch-level values are the first
    TensorDict's (tensordict's own ``cat`` stacks them when they differ); TensorDicts without a batch
    dimension (batch-level values only) give the first one."""
    _require(len(data) > 0, "concat_tensordict needs at least one TensorDict")
    if len(data[0].batch_size) == 0:
        _require(all(len(td.batch_size) == 0 for td in data), "TensorDicts with and without rows cannot be joined")
        return data[0]
    nested = {key for key, val in data[0].items() if _is_nested(val)}
    batch_level = {key: val for key, val in data[0].items() if isinstance(val, NonTensorData)}
    rows = []
    for td in data:
        _require({k for k, v in td.items() if _is_nested(v)} == nested,
                 "every TensorDict must have the same nested tensors")
        rows.append(TensorDict({k: v for k, v in td.items() if k not in nested and k not in batch_level},
                               batch_size=td.batch_size, device=td.device))
    output = TensorDict.cat(rows, dim=0)
    for key in nested:
        output[key] = concat_nested_tensors([td[key] for td in data])
    for key, val in batch_level.items():
        output[key] = val
    return output


def union_tensor_dict(tensor_dict1: TensorDict, tensor_dict2: TensorDict) -> TensorDict:
    """Add the keys of ``tensor_dict2`` to ``tensor_dict1`` (in place); a key in both must hold
    equal values."""
    _require(tensor_dict1.batch_size == tensor_dict2.batch_size,
             f"the batch sizes differ: {tensor_dict1.batch_size} and {tensor_dict2.batch_size}")
    for key in tensor_dict2.keys():
        if key not in tensor_dict1.keys():
            tensor_dict1[key] = tensor_dict2.get(key)
        elif isinstance(tensor_dict2[key], torch.Tensor):
            _require(tensor_dict1[key].equal(tensor_dict2[key]),
                     f"{key} in tensor_dict1 and tensor_dict2 are not the same object")
        else:
            _require(tensor_dict1[key] == tensor_dict2[key],
                     f"{key} in tensor_dict1 and tensor_dict2 are not the same object")
    return tensor_dict1


def make_iterator(tensordict: TensorDict, mini_batch_size: int, epochs: int, seed: int | None = None,
                  dataloader_kwargs: dict[str, Any] | None = None) -> Iterator[TensorDict]:
    """Mini-batches of ``mini_batch_size`` rows, ``epochs`` passes (a DataLoader over the row
    indices: ``shuffle`` etc. in ``dataloader_kwargs``, seeded by ``seed``)."""
    from torch.utils.data import DataLoader

    _require(tensordict.batch_size[0] % mini_batch_size == 0,
             f"{tensordict.batch_size[0]} rows do not split into mini-batches of {mini_batch_size}")
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    loader = DataLoader(torch.arange(tensordict.shape[0]), batch_size=mini_batch_size, collate_fn=lambda x: x,
                        generator=generator, **(dataloader_kwargs or {}))

    def batches() -> Iterator[TensorDict]:
        for _ in range(epochs):
            for indices in loader:
                yield index_select_tensor_dict(tensordict, indices)

    return iter(batches())


def pad_to_divisor(data: TensorDict, size_divisor: int) -> tuple[TensorDict, int]:
    """``(padded, pad_size)``: rows repeated from the start until the length divides ``size_divisor``."""
    _require(isinstance(data, TensorDict), f"expected a TensorDict, got {type(data).__name__}")
    if len(data) % size_divisor == 0:
        return data, 0
    pad_size = size_divisor - len(data) % size_divisor
    pieces, missing = [data], pad_size
    while missing > 0:
        pieces.append(data[:min(missing, len(data))])
        missing -= len(pieces[-1])
    return torch.cat(pieces), pad_size


def unpad(data: TensorDict, pad_size: int) -> TensorDict:
    """``data`` without its last ``pad_size`` rows."""
    return data[:-pad_size] if pad_size else data


# ------------------------------------------------------------------ access
def get(tensordict: TensorDict, key: str, default: Any = None) -> Any:
    """``tensordict[key]`` as Python: a tensor, a list (per-row values) or the batch-level value."""
    return _plain(tensordict.get(key)) if key in tensordict.keys() else default


def pop(tensordict: TensorDict, key: str, default: Any = None) -> Any:
    """Remove ``key`` and return its value as :func:`get` does."""
    return _plain(tensordict.pop(key)) if key in tensordict.keys() else default


def _take(tensordict: TensorDict, keys: Iterable[str], remove: bool) -> TensorDict:
    rows: dict[str, Any] = {}
    batch: dict[str, Any] = {}
    for key in keys:
        if key not in tensordict.keys():
            raise ProtocolKeyError(f"key {key} not in tensordict (keys: {sorted(tensordict.keys())})")
        val = tensordict.pop(key) if remove else tensordict.get(key)
        (batch if isinstance(val, NonTensorData) else rows)[key] = _plain(val)
    return get_tensordict(rows, batch)


def get_keys(tensordict: TensorDict, keys: Iterable[str]) -> TensorDict:
    """A new TensorDict of ``keys`` (a missing key raises ``KeyError``)."""
    return _take(tensordict, keys, remove=False)


def pop_keys(tensordict: TensorDict, keys: Iterable[str]) -> TensorDict:
    """Remove ``keys`` and return them as a new TensorDict (a missing key raises ``KeyError``)."""
    return _take(tensordict, keys, remove=True)
