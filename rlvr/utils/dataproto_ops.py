"""Row and key operations behind :class:`rlvr.protocol.DataProto`: equality of tensors / object
arrays, unions of key sets, merging of ``meta_info`` and index normalisation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

__all__ = [
    "METRICS_KEY",
    "to_object_array",
    "values_equal",
    "arrays_equal",
    "compact_tensor",
    "union_tensor_dict",
    "union_numpy_dict",
    "merge_meta_info",
    "index_tensor",
]

METRICS_KEY = "metrics"


def to_object_array(values: Sequence[Any]) -> np.ndarray:
    """Turn a list into a 1-D object array of ``len(values)`` (nested lists stay python objects)."""
    out = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        out[i] = value
    return out


def values_equal(a: Any, b: Any) -> bool:
    """Equality that works for tensors, numpy arrays and plain python values."""
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and bool(
            torch.equal(a, b)
        )
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return arrays_equal(np.asarray(a), np.asarray(b))
    result = a == b
    if isinstance(result, (np.ndarray, torch.Tensor)):
        return bool(result.all())
    return bool(result)


def arrays_equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Element-wise equality of two numpy arrays, including object arrays of dicts / lists."""
    if a.shape != b.shape:
        return False
    if a.dtype != object and b.dtype != object:
        return bool(np.array_equal(a, b))
    return all(values_equal(x, y) for x, y in zip(a.ravel(), b.ravel(), strict=True))


def compact_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """Copy a view whose storage is larger than the view, so pickling ships only its own bytes."""
    if tensor.untyped_storage().nbytes() > tensor.numel() * tensor.element_size() or not tensor.is_contiguous():
        return tensor.clone(memory_format=torch.contiguous_format)
    return tensor


def union_tensor_dict(td1: TensorDict, td2: TensorDict) -> TensorDict:
    """Add the keys of ``td2`` to ``td1`` in place; a shared key must hold equal tensors.

    Raises:
        ValueError: the batch sizes differ, or a shared key holds different values.
    """
    if td1.batch_size != td2.batch_size:
        raise ValueError(
            f"cannot union TensorDicts with batch sizes {list(td1.batch_size)} and {list(td2.batch_size)}"
        )
    for key, value in td2.items():
        if key in td1.keys() and not values_equal(td1[key], value):
            raise ValueError(
                f"cannot union: key '{key}' exists in both batches with different values; "
                "rename or pop one of them first"
            )
        td1[key] = value
    return td1


def union_numpy_dict(d1: dict[str, np.ndarray], d2: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Add the entries of ``d2`` to ``d1`` in place; a shared key must hold equal arrays.

    Raises:
        ValueError: a shared key holds different values.
    """
    for key, value in d2.items():
        if key in d1 and not arrays_equal(d1[key], value):
            raise ValueError(
                f"cannot union: non-tensor key '{key}' exists in both batches with different values; "
                "rename or pop one of them first"
            )
        d1[key] = value
    return d1


def merge_meta_info(metas: Sequence[dict]) -> dict:
    """Merge ``meta_info`` of several chunks (see :meth:`DataProto.concat`)."""
    merged: dict[str, Any] = {}
    metrics: dict[str, list] = {}
    for meta in metas:
        for key, value in meta.items():
            if key == METRICS_KEY:
                for name, metric in value.items():
                    values = metric if isinstance(metric, list) else [metric]
                    metrics.setdefault(name, []).extend(values)
            elif key not in merged:
                merged[key] = value
            elif not values_equal(merged[key], value):
                raise ValueError(
                    f"cannot concat: meta_info['{key}'] differs between chunks ({merged[key]!r} vs {value!r}); "
                    "only meta_info['metrics'] is merged, other keys must agree"
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
