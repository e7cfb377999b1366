"""Row and key operations behind :class:`rlvr.protocol.DataProto`: equality of tensors / object
arrays, unions of key sets, merging of ``meta_info``, index normalisation and chunk sizes.

Errors are :mod:`rlvr.utils.errors` protocol errors, which are also ``AssertionError`` /
``KeyError`` / ``TypeError`` where verl raises those.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from rlvr.utils.errors import ProtocolError, ProtocolTypeError

__all__ = [
    "METRICS_KEY",
    "to_object_array",
    "tensordict_from",
    "deep_equal",
    "values_equal",
    "compact_tensor",
    "union_tensor_dict",
    "union_numpy_dict",
    "union_meta_info",
    "merge_meta_info",
    "index_tensor",
    "chunk_sizes",
]

METRICS_KEY = "metrics"


def to_object_array(values: Sequence[Any]) -> np.ndarray:
    """Turn a list into a 1-D object array of ``len(values)`` (nested lists stay python objects)."""
    out = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        out[i] = value
    return out


def tensordict_from(tensors: dict[str, torch.Tensor]) -> TensorDict:
    """A TensorDict with batch dim 0, after checking that every value is a tensor and all agree on dim 0.

    Raises:
        ProtocolTypeError: a value is not a tensor.
        ProtocolError: a tensor is 0-dim, or two tensors disagree on dim 0 (naming both keys).
    """
    batch_size = None
    first_key = None
    for key, value in tensors.items():
        if not isinstance(value, torch.Tensor):
            raise ProtocolTypeError(
                f"batch['{key}'] is a {type(value).__name__}, not a torch.Tensor; put non-tensor values "
                "in non_tensor_batch (or use DataProto.from_single_dict, which splits them)"
            )
        if value.dim() == 0:
            raise ProtocolError(f"batch['{key}'] is a 0-dim tensor; every tensor needs batch dim 0")
        if batch_size is None:
            batch_size, first_key = value.shape[0], key
        elif value.shape[0] != batch_size:
            raise ProtocolError(
                f"batch size mismatch: tensor '{key}' has {value.shape[0]} rows (shape {list(value.shape)}) "
                f"but '{first_key}' has {batch_size}"
            )
    return TensorDict(dict(tensors), batch_size=[batch_size] if batch_size is not None else [])


def deep_equal(a: Any, b: Any, _seen: frozenset[int] = frozenset()) -> bool:
    """Strict structural equality, as verl compares non-tensor arrays in a union.

    Values of different types are unequal (``1`` vs ``1.0``, ``str`` vs ``np.str_``); NaN equals
    NaN; numpy arrays need the same dtype and shape and, for object arrays, equal elements
    (compared recursively, as are dicts and lists); tensors compare with ``torch.equal``. A value met again inside itself
    (a self-referencing object array) counts as equal on that path.
    """
    if type(a) is not type(b):
        return False
    if id(a) in _seen:
        return True
    if isinstance(a, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, torch.Tensor):
        return a.shape == b.shape and bool(torch.equal(a, b))
    if isinstance(a, dict):  # e.g. a row's image tensors (multi_modal_inputs)
        return a.keys() == b.keys() and all(deep_equal(a[key], b[key], _seen | {id(a)}) for key in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(deep_equal(x, y, _seen | {id(a)}) for x, y in zip(a, b, strict=True))
    if not isinstance(a, np.ndarray):
        return bool(values_equal(a, b))
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype != object:
        return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
    seen = _seen | {id(a)}
    return all(deep_equal(x, y, seen) for x, y in zip(a.ravel(), b.ravel(), strict=True))


def values_equal(a: Any, b: Any) -> bool:
    """``a == b`` reduced to one bool for any value (tensors and arrays compare element-wise).

    Used for ``meta_info`` values, where verl compares with ``==`` (so ``1 == 1.0``).
    """
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and deep_equal(a, b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        if a.dtype == object or b.dtype == object:
            return a.shape == b.shape and all(values_equal(x, y) for x, y in zip(a.ravel(), b.ravel(), strict=True))
        return bool(np.array_equal(a, b))
    result = a == b
    if isinstance(result, (np.ndarray, torch.Tensor)):
        return bool(result.all())
    return bool(result)


def compact_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """Copy a view whose storage is larger than the view, so pickling ships only its own bytes."""
    if tensor.untyped_storage().nbytes() > tensor.numel() * tensor.element_size() or not tensor.is_contiguous():
        return tensor.clone(memory_format=torch.contiguous_format)
    return tensor


def union_tensor_dict(tensor_dict1: TensorDict, tensor_dict2: TensorDict) -> TensorDict:
    """Add the keys of ``tensor_dict2`` to ``tensor_dict1`` in place; a shared key must hold equal tensors.

    Raises:
        ProtocolError: the batch sizes differ, or a shared key holds different values.
    """
    if tensor_dict1.batch_size != tensor_dict2.batch_size:
        raise ProtocolError(
            f"cannot union TensorDicts with batch sizes {list(tensor_dict1.batch_size)} and "
            f"{list(tensor_dict2.batch_size)}"
        )
    for key, value in tensor_dict2.items():
        if key in tensor_dict1.keys() and not deep_equal(tensor_dict1[key], value):
            raise ProtocolError(
                f"cannot union: key '{key}' exists in both batches with different values ({key} in tensor_dict1 "
                "and tensor_dict2 are not the same object); rename or pop one of them first"
            )
        tensor_dict1[key] = value
    return tensor_dict1


def union_numpy_dict(tensor_dict1: dict[str, np.ndarray], tensor_dict2: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Add the entries of ``tensor_dict2`` to ``tensor_dict1`` in place; a shared key must hold
    equal arrays (:func:`deep_equal`: same dtype and shape, NaN equals NaN).

    Raises:
        ProtocolTypeError: a shared key's value is not a numpy array.
        ProtocolError: a shared key holds different values.
    """
    for key, value in tensor_dict2.items():
        if key in tensor_dict1:
            if not isinstance(value, np.ndarray) or not isinstance(tensor_dict1[key], np.ndarray):
                raise ProtocolTypeError(f"cannot union non-tensor key '{key}': both values must be numpy arrays")
            if not deep_equal(tensor_dict1[key], value):
                raise ProtocolError(
                    f"cannot union: non-tensor key '{key}' exists in both batches with different values "
                    f"(`{key}` in tensor_dict1 and tensor_dict2 are not the same object.); rename or pop one of "
                    "them first"
                )
        tensor_dict1[key] = value
    return tensor_dict1


def union_meta_info(meta1: dict[str, Any], meta2: dict[str, Any]) -> dict[str, Any]:
    """Add the entries of ``meta2`` to ``meta1`` in place; a shared key must hold equal values.

    Raises:
        ProtocolError: a shared key holds different values.
    """
    for key, value in meta2.items():
        if key in meta1 and not values_equal(meta1[key], value):
            raise ProtocolError(f"cannot union: meta_info['{key}'] differs ({meta1[key]!r} vs {value!r})")
        meta1[key] = value
    return meta1


def _metric_dicts(value: Any) -> list[dict]:
    """``meta_info["metrics"]`` of one part as a list of dicts (a dict, a list of dicts, or None)."""
    if value is None:
        return []
    dicts = value if isinstance(value, list) else [value]
    for d in dicts:
        if not isinstance(d, dict):
            raise ProtocolTypeError(
                f"meta_info['{METRICS_KEY}'] must be a dict (name -> value) or a list of such dicts, "
                f"got {type(d).__name__}"
            )
    return dicts


def merge_meta_info(metas: Sequence[dict]) -> dict:
    """Merge the ``meta_info`` of the parts of a :meth:`DataProto.concat`.

    ``meta_info["metrics"]`` (a dict, or a list of dicts, per part) becomes one dict mapping each
    metric name to the flat list of the values of all parts in order (a list value is extended,
    a scalar appended). Every other key is kept; a key present in several parts must hold equal
    values.

    Raises:
        ProtocolError: a non-metric key holds different values in two parts.
    """
    merged: dict[str, Any] = {}
    metrics: dict[str, list] = {}
    for meta in metas:
        for key, value in meta.items():
            if key == METRICS_KEY:
                for metric_dict in _metric_dicts(value):
                    for name, metric in metric_dict.items():
                        metrics.setdefault(name, []).extend(metric if isinstance(metric, list) else [metric])
            elif key not in merged:
                merged[key] = value
            elif not values_equal(merged[key], value):
                raise ProtocolError(
                    f"Conflicting values for meta_info key '{key}' in the parts being concatenated "
                    f"({merged[key]!r} vs {value!r}); only meta_info['{METRICS_KEY}'] is merged, other keys must agree"
                )
    if metrics:
        merged[METRICS_KEY] = metrics
    return merged


def index_tensor(idxs: Any, length: int) -> torch.Tensor:
    """Normalise a list / numpy array / tensor of ints or bools to a 1-D int64 index tensor."""
    index = torch.as_tensor(np.asarray(idxs)) if not isinstance(idxs, torch.Tensor) else idxs
    if index.numel() == 0:
        return torch.empty(0, dtype=torch.long)
    if index.dtype == torch.bool:
        if index.shape != (length,):
            raise IndexError(f"boolean mask has shape {list(index.shape)}, expected [{length}]")
        return index.nonzero(as_tuple=True)[0]
    if index.dtype.is_floating_point or index.dtype.is_complex:
        raise IndexError(f"index must hold ints or bools, got dtype {index.dtype}")
    return index.reshape(-1).to(torch.long)


def chunk_sizes(length: int, chunks: int) -> list[int]:
    """Rows per part when ``length`` rows are cut into ``chunks`` parts of ``ceil(length / chunks)``
    rows, the last ones shorter or empty (``torch.chunk``'s sizes, padded with empty parts to
    exactly ``chunks`` parts): ``chunk_sizes(10, 4) == [3, 3, 3, 1]``, ``chunk_sizes(1, 3) == [1, 0, 0]``.
    """
    size = -(-length // chunks)
    return [max(0, min(size, length - i * size)) for i in range(chunks)]
