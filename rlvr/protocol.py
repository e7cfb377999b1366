"""``DataProto``: the one record that crosses every process boundary in rlvr.

A ``DataProto`` holds one batch of samples in three parts:

- ``batch``: a :class:`tensordict.TensorDict` whose tensors all share batch dimension 0
  (e.g. ``input_ids [batch, seq_len]``, ``old_log_probs [batch, response_len]``);
- ``non_tensor_batch``: ``dict[str, np.ndarray]``, each a numpy array (usually ``dtype=object``)
  of the same length as the batch (e.g. ``uid``, ``data_source``, ``raw_prompt``);
- ``meta_info``: a plain dict of batch-level values (``temperature``, ``global_steps``,
  ``metrics``, ...).

Sizes are checked at construction, so a mismatch fails where it is made, not three stages later.
The key names rlvr uses are listed in ``docs/DEV_CONTRACT.md``.
"""

from __future__ import annotations

import copy
import os
import pickle
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from rlvr.utils.dataproto_ops import (
    compact_tensor,
    index_tensor,
    merge_meta_info,
    to_object_array,
    union_numpy_dict,
    union_tensor_dict,
    values_equal,
)

__all__ = [
    "DataProto",
    "DataProtoItem",
    "pad_dataproto_to_divisor",
    "unpad_dataproto",
    "union_tensor_dict",
    "union_numpy_dict",
]


# ----------------------------------------------------------------------------- items
@dataclass(eq=False)
class DataProtoItem:
    """One sample of a :class:`DataProto` (what ``data[i]`` returns).

    Attributes:
        batch: TensorDict with ``batch_size=[]`` (e.g. ``responses [response_len]``), or None.
        non_tensor_batch: one python value per non-tensor key.
        meta_info: the parent's ``meta_info`` (shared, not copied).
    """

    batch: TensorDict | None = None
    non_tensor_batch: dict[str, Any] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)


# ----------------------------------------------------------------------------- DataProto
@dataclass(eq=False)
class DataProto:
    """A batch of samples: tensors, per-sample python objects and batch-level metadata.

    Attributes:
        batch: TensorDict with ``batch_size=[batch]``; every tensor is ``[batch, ...]``. None when
            the record carries no tensors.
        non_tensor_batch: ``{key: np.ndarray [batch, ...]}`` (lists are converted to 1-D object
            arrays at construction).
        meta_info: batch-level values; ``meta_info["metrics"]`` maps a metric name to a float or a
            list of floats.

    Raises (at construction):
        ValueError: tensors or arrays disagree on the batch size (the message names the key).
        TypeError: a value has the wrong type (e.g. a tensor in ``non_tensor_batch``).
    """

    batch: TensorDict | None = None
    non_tensor_batch: dict[str, np.ndarray] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.batch, dict):
            self.batch = self._tensordict_from(self.batch)
        self.non_tensor_batch = {
            key: to_object_array(value) if isinstance(value, (list, tuple)) else value
            for key, value in self.non_tensor_batch.items()
        }
        self.check_consistency()

    # ------------------------------------------------------------------ construction
    @staticmethod
    def _tensordict_from(tensors: dict[str, torch.Tensor]) -> TensorDict:
        """Build a TensorDict with batch dim 0 after checking every tensor agrees on it."""
        batch_size = None
        first_key = None
        for key, value in tensors.items():
            if not isinstance(value, torch.Tensor):
                raise TypeError(
                    f"batch['{key}'] is a {type(value).__name__}, not a torch.Tensor; put non-tensor values "
                    "in non_tensor_batch (or use DataProto.from_single_dict, which splits them)"
                )
            if value.dim() == 0:
                raise ValueError(f"batch['{key}'] is a 0-dim tensor; every tensor needs batch dim 0")
            if batch_size is None:
                batch_size, first_key = value.shape[0], key
            elif value.shape[0] != batch_size:
                raise ValueError(
                    f"batch size mismatch: tensor '{key}' has {value.shape[0]} rows (shape {list(value.shape)}) "
                    f"but '{first_key}' has {batch_size}"
                )
        return TensorDict(dict(tensors), batch_size=[batch_size] if batch_size is not None else [])

    @classmethod
    def from_dict(
        cls,
        tensors: dict[str, torch.Tensor] | None = None,
        non_tensors: dict[str, np.ndarray | list] | None = None,
        meta_info: dict[str, Any] | None = None,
    ) -> DataProto:
        """Build a DataProto from ``{key: tensor [batch, ...]}`` and ``{key: array/list [batch]}``."""
        batch = cls._tensordict_from(tensors) if tensors else None
        return cls(batch=batch, non_tensor_batch=dict(non_tensors or {}), meta_info=dict(meta_info or {}))

    @classmethod
    def from_single_dict(cls, data: dict[str, Any], meta_info: dict[str, Any] | None = None) -> DataProto:
        """Build a DataProto from one dict, sending tensors to ``batch`` and everything else
        (numpy arrays, lists) to ``non_tensor_batch``."""
        tensors = {k: v for k, v in data.items() if isinstance(v, torch.Tensor)}
        non_tensors = {k: v for k, v in data.items() if not isinstance(v, torch.Tensor)}
        return cls.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta_info)

    def check_consistency(self) -> None:
        """Check that every tensor and every non-tensor array has the same batch size.

        Raises:
            ValueError / TypeError: naming the offending key and the sizes found.
        """
        if self.batch is not None:
            if not isinstance(self.batch, TensorDict):
                raise TypeError(f"DataProto.batch must be a TensorDict or None, got {type(self.batch).__name__}")
            if self.batch.batch_dims != 1:
                raise ValueError(
                    f"DataProto.batch must have exactly one batch dim, got batch_size={list(self.batch.batch_size)}"
                )
        expected = len(self) if self.batch is not None else None
        reference = "the tensor batch"
        for key, value in self.non_tensor_batch.items():
            if isinstance(value, torch.Tensor):
                raise TypeError(f"non_tensor_batch['{key}'] is a torch.Tensor; put tensors in batch instead")
            if not isinstance(value, np.ndarray):
                raise TypeError(
                    f"non_tensor_batch['{key}'] must be a numpy array or a list, got {type(value).__name__}"
                )
            if value.ndim == 0:
                raise ValueError(f"non_tensor_batch['{key}'] is a 0-dim array; it needs one entry per sample")
            if expected is None:
                expected, reference = value.shape[0], f"non_tensor_batch['{list(self.non_tensor_batch)[0]}']"
            elif value.shape[0] != expected:
                raise ValueError(
                    f"batch size mismatch: non_tensor_batch['{key}'] has {value.shape[0]} entries "
                    f"but {reference} has {expected}"
                )
        if not isinstance(self.meta_info, dict):
            raise TypeError(f"DataProto.meta_info must be a dict, got {type(self.meta_info).__name__}")

    # ------------------------------------------------------------------ size / access
    def __len__(self) -> int:
        if self.batch is not None:
            return int(self.batch.batch_size[0])
        for value in self.non_tensor_batch.values():
            return int(value.shape[0])
        return 0

    def __getitem__(self, item: Any) -> DataProto | DataProtoItem:
        """``data[i]`` -> :class:`DataProtoItem`; ``data[a:b]`` -> view; ``data[list / array /
        int tensor / bool mask]`` -> a new DataProto with those rows."""
        if isinstance(item, (int, np.integer)):
            length = len(self)
            if not -length <= item < length:
                raise IndexError(f"index {item} out of range for DataProto of length {length}")
            batch = self.batch[int(item)] if self.batch is not None else None
            non_tensor = {key: value[item] for key, value in self.non_tensor_batch.items()}
            return DataProtoItem(batch=batch, non_tensor_batch=non_tensor, meta_info=self.meta_info)
        if isinstance(item, slice):
            return self.slice(item.start, item.stop, item.step)
        if isinstance(item, (list, tuple, np.ndarray, torch.Tensor)):
            return self.select_idxs(item)
        raise TypeError(f"DataProto indices must be int, slice, list, numpy array or tensor, not {type(item).__name__}")

    def __iter__(self) -> Iterator[DataProtoItem]:
        for i in range(len(self)):
            yield self[i]

    def slice(self, start: int | None = None, end: int | None = None, step: int | None = None) -> DataProto:
        """Rows ``start:end:step`` as a view (tensors share storage with ``self``)."""
        rows = slice(start, end, step)
        batch = self.batch[rows] if self.batch is not None else None
        non_tensor = {key: value[rows] for key, value in self.non_tensor_batch.items()}
        return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(self.meta_info))

    def select_idxs(self, idxs: Any) -> DataProto:
        """Rows picked by an index list / array / tensor, or by a boolean mask ``[batch]`` (copies)."""
        index = index_tensor(idxs, len(self))
        batch = self.batch[index] if self.batch is not None else None
        np_index = index.cpu().numpy()
        non_tensor = {key: value[np_index] for key, value in self.non_tensor_batch.items()}
        return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(self.meta_info))

    # ------------------------------------------------------------------ key operations
    def _missing(self, keys: Sequence[str], available: Sequence[str], where: str) -> None:
        missing = [k for k in keys if k not in available]
        if missing:
            raise KeyError(f"{where} has no key(s) {missing}; available: {sorted(available)}")

    def select(
        self,
        batch_keys: Sequence[str] | None = None,
        non_tensor_batch_keys: Sequence[str] | None = None,
        meta_info_keys: Sequence[str] | None = None,
        deepcopy: bool = False,
    ) -> DataProto:
        """A DataProto with only the given keys (None keeps all keys of that part).

        Tensors are shared with ``self`` unless ``deepcopy=True``.
        """
        batch = self.batch
        if batch_keys is not None:
            self._missing(batch_keys, list(batch.keys()) if batch is not None else [], "batch")
            batch = batch.select(*batch_keys) if batch is not None else None
        non_tensor = dict(self.non_tensor_batch)
        if non_tensor_batch_keys is not None:
            self._missing(non_tensor_batch_keys, list(non_tensor), "non_tensor_batch")
            non_tensor = {k: non_tensor[k] for k in non_tensor_batch_keys}
        meta = dict(self.meta_info)
        if meta_info_keys is not None:
            self._missing(meta_info_keys, list(meta), "meta_info")
            meta = {k: meta[k] for k in meta_info_keys}
        if deepcopy:
            batch = batch.clone() if batch is not None else None
            non_tensor, meta = copy.deepcopy(non_tensor), copy.deepcopy(meta)
        return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)

    def pop(
        self,
        batch_keys: Sequence[str] | None = None,
        non_tensor_batch_keys: Sequence[str] | None = None,
        meta_info_keys: Sequence[str] | None = None,
    ) -> DataProto:
        """Remove the given keys from ``self`` and return them as a new DataProto (None pops nothing)."""
        batch_keys, non_tensor_batch_keys = list(batch_keys or []), list(non_tensor_batch_keys or [])
        meta_info_keys = list(meta_info_keys or [])
        available = list(self.batch.keys()) if self.batch is not None else []
        self._missing(batch_keys, available, "batch")
        self._missing(non_tensor_batch_keys, list(self.non_tensor_batch), "non_tensor_batch")
        self._missing(meta_info_keys, list(self.meta_info), "meta_info")
        tensors = {key: self.batch.pop(key) for key in batch_keys}
        non_tensors = {key: self.non_tensor_batch.pop(key) for key in non_tensor_batch_keys}
        meta = {key: self.meta_info.pop(key) for key in meta_info_keys}
        return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta)

    def union(self, other: DataProto) -> DataProto:
        """Add ``other``'s keys to ``self`` in place and return ``self``.

        Raises:
            ValueError: the lengths differ, or a key present in both holds different values.
        """
        if len(self) and len(other) and len(self) != len(other):
            raise ValueError(f"cannot union DataProtos of lengths {len(self)} and {len(other)}")
        if other.batch is not None:
            self.batch = other.batch.clone(False) if self.batch is None else union_tensor_dict(self.batch, other.batch)
        union_numpy_dict(self.non_tensor_batch, other.non_tensor_batch)
        for key, value in other.meta_info.items():
            if key in self.meta_info and not values_equal(self.meta_info[key], value):
                raise ValueError(f"cannot union: meta_info['{key}'] differs ({self.meta_info[key]!r} vs {value!r})")
            self.meta_info[key] = value
        self.check_consistency()
        return self

    # ------------------------------------------------------------------ splitting and joining
    def chunk(self, chunks: int) -> list[DataProto]:
        """Split into ``chunks`` equal parts (views). The length must be divisible by ``chunks``.

        Raises:
            ValueError: not divisible; pad first with :func:`pad_dataproto_to_divisor` and drop the
                padding after the call with :func:`unpad_dataproto`.
        """
        if chunks <= 0:
            raise ValueError(f"chunks must be positive, got {chunks}")
        if len(self) % chunks:
            raise ValueError(
                f"cannot chunk a DataProto of length {len(self)} into {chunks} equal parts; pad it with "
                f"rlvr.protocol.pad_dataproto_to_divisor(data, {chunks}) first and unpad the result"
            )
        return self.split(len(self) // chunks) if len(self) else [self.slice(0, 0) for _ in range(chunks)]

    def split(self, split_size: int) -> list[DataProto]:
        """Split into consecutive parts of ``split_size`` rows (the last part may be shorter)."""
        if split_size <= 0:
            raise ValueError(f"split_size must be positive, got {split_size}")
        return [self.slice(start, start + split_size) for start in range(0, len(self), split_size)]

    @staticmethod
    def concat(data: Sequence[DataProto]) -> DataProto:
        """Join DataProtos row-wise (all must have the same keys and dtypes).

        ``meta_info["metrics"]`` is merged: each metric name maps to the list of the values of all
        parts (list values are extended, scalars appended). Every other ``meta_info`` key must be
        equal in all parts that have it.
        """
        if not data:
            raise ValueError("DataProto.concat needs at least one DataProto")
        return _cat_rows(data, merge_meta_info([d.meta_info for d in data]))

    def repeat(self, repeat_times: int = 2, interleave: bool = True) -> DataProto:
        """Repeat every row ``repeat_times`` times.

        ``interleave=True`` gives ``[a, a, b, b]`` (the ``n`` samples of a prompt stay together);
        ``interleave=False`` gives ``[a, b, a, b]``.
        """
        if repeat_times < 1:
            raise ValueError(f"repeat_times must be >= 1, got {repeat_times}")
        if interleave:
            index = torch.arange(len(self)).repeat_interleave(repeat_times)
        else:
            index = torch.arange(len(self)).repeat(repeat_times)
        return self.select_idxs(index)

    def reorder(self, indices: torch.Tensor | np.ndarray | list[int]) -> None:
        """Permute the rows in place: row ``i`` becomes old row ``indices[i]``."""
        index = index_tensor(indices, len(self))
        if index.numel() != len(self):
            raise ValueError(f"reorder needs {len(self)} indices, got {index.numel()}")
        reordered = self.select_idxs(index)
        self.batch, self.non_tensor_batch = reordered.batch, reordered.non_tensor_batch

    def to(self, device: str | torch.device) -> DataProto:
        """Move the tensors to ``device`` (in place) and return ``self``."""
        if self.batch is not None:
            self.batch = self.batch.to(device)
        return self

    # ------------------------------------------------------------------ persistence
    def __getstate__(self) -> dict[str, Any]:
        batch = None
        if self.batch is not None:
            batch = {
                "tensors": {k: compact_tensor(v) for k, v in self.batch.items(include_nested=True, leaves_only=True)},
                "batch_size": list(self.batch.batch_size),
            }
        return {"batch": batch, "non_tensor_batch": self.non_tensor_batch, "meta_info": self.meta_info}

    def __setstate__(self, state: dict[str, Any]) -> None:
        batch = state["batch"]
        self.batch = None
        if batch is not None:
            self.batch = TensorDict({}, batch_size=batch["batch_size"])
            for key, value in batch["tensors"].items():
                self.batch.set(key, value)
        self.non_tensor_batch = state["non_tensor_batch"]
        self.meta_info = state["meta_info"]

    def save_to_disk(self, path: str | os.PathLike) -> None:
        """Write to ``path`` atomically (a temp file in the same folder, then a rename)."""
        path = os.fspath(path)
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".dataproto-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                pickle.dump(self, f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.remove(tmp)
            raise

    @staticmethod
    def load_from_disk(path: str | os.PathLike) -> DataProto:
        """Read a DataProto written by :meth:`save_to_disk` (only load files you trust: pickle)."""
        with open(path, "rb") as f:
            data = pickle.load(f)
        if not isinstance(data, DataProto):
            raise TypeError(f"{path} holds a {type(data).__name__}, not a DataProto")
        return data

    # ------------------------------------------------------------------ display
    def size_bytes(self) -> tuple[int, int]:
        """(bytes of tensors, approximate bytes of non-tensor arrays)."""
        tensor_bytes = 0
        if self.batch is not None:
            tensor_bytes = sum(
                v.numel() * v.element_size() for v in self.batch.values(include_nested=True, leaves_only=True)
            )
        non_tensor_bytes = sum(v.nbytes for v in self.non_tensor_batch.values())
        return tensor_bytes, non_tensor_bytes

    def print_size(self, prefix: str = "") -> None:
        """Print the memory taken by the tensors and the non-tensor arrays in MB."""
        tensor_bytes, non_tensor_bytes = self.size_bytes()
        print(
            f"{prefix}DataProto size: tensors {tensor_bytes / 2**20:.3f} MB, "
            f"non-tensors {non_tensor_bytes / 2**20:.3f} MB"
        )

    def __repr__(self) -> str:
        parts = []
        if self.batch is not None:
            for key, value in self.batch.items(include_nested=True, leaves_only=True):
                parts.append(f"{key}: {list(value.shape)} {str(value.dtype).removeprefix('torch.')}")
        for key, value in self.non_tensor_batch.items():
            parts.append(f"{key}: np[{', '.join(map(str, value.shape))}] {value.dtype}")
        return f"DataProto(len={len(self)}, {{{', '.join(parts)}}}, meta_info={sorted(self.meta_info)})"


def _cat_rows(data: Sequence[DataProto], meta_info: dict[str, Any]) -> DataProto:
    """Concatenate the rows of ``data`` (same keys and dtypes required) with the given meta_info."""
    first = data[0]
    has_batch = [d.batch is not None for d in data]
    if any(has_batch) and not all(has_batch):
        raise ValueError("cannot concat: some DataProtos have tensors and some have none")
    batch = None
    if first.batch is not None:
        keys = sorted(first.batch.keys())
        for i, d in enumerate(data[1:], start=1):
            if sorted(d.batch.keys()) != keys:
                raise ValueError(f"cannot concat: part {i} has tensor keys {sorted(d.batch.keys())}, part 0 has {keys}")
            for key in keys:
                if d.batch[key].dtype != first.batch[key].dtype:
                    raise ValueError(
                        f"cannot concat: tensor '{key}' is {d.batch[key].dtype} in part {i} "
                        f"but {first.batch[key].dtype} in part 0"
                    )
        batch = torch.cat([d.batch for d in data], dim=0)
    keys = sorted(first.non_tensor_batch)
    for i, d in enumerate(data[1:], start=1):
        if sorted(d.non_tensor_batch) != keys:
            raise ValueError(
                f"cannot concat: part {i} has non-tensor keys {sorted(d.non_tensor_batch)}, part 0 has {keys}"
            )
    non_tensor = {key: np.concatenate([d.non_tensor_batch[key] for d in data], axis=0) for key in keys}
    return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=meta_info)


def pad_dataproto_to_divisor(data: DataProto, size_divisor: int) -> tuple[DataProto, int]:
    """Pad ``data`` so its length is a multiple of ``size_divisor``.

    The padding repeats rows from the start (``0, 1, 2, ...``, wrapping around when more padding
    rows than rows are needed), so padded rows are valid samples.

    Returns:
        ``(padded, pad_size)``; pass ``pad_size`` to :func:`unpad_dataproto` afterwards.
    """
    if size_divisor <= 0:
        raise ValueError(f"size_divisor must be positive, got {size_divisor}")
    length = len(data)
    pad_size = (-length) % size_divisor
    if pad_size == 0:
        return data, 0
    if length == 0:
        raise ValueError(f"cannot pad an empty DataProto to a multiple of {size_divisor}")
    padding = data.select_idxs(torch.arange(pad_size) % length)
    return _cat_rows([data, padding], dict(data.meta_info)), pad_size


def unpad_dataproto(data: DataProto, pad_size: int) -> DataProto:
    """Drop the last ``pad_size`` rows added by :func:`pad_dataproto_to_divisor`."""
    if pad_size < 0 or pad_size > len(data):
        raise ValueError(f"pad_size {pad_size} is invalid for a DataProto of length {len(data)}")
    return data.slice(0, len(data) - pad_size) if pad_size else data
