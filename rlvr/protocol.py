"""``DataProto``: the one record that crosses every process boundary in rlvr.

A ``DataProto`` holds one batch of samples in three parts:

- ``batch``: a :class:`tensordict.TensorDict` whose tensors all share batch dimension 0
  (e.g. ``input_ids [batch, seq_len]``, ``old_log_probs [batch, response_len]``);
- ``non_tensor_batch``: ``dict[str, np.ndarray]``, each a numpy array (usually ``dtype=object``)
  of the same length as the batch (e.g. ``uid``, ``data_source``, ``raw_prompt``);
- ``meta_info``: a plain dict of batch-level values (``temperature``, ``global_steps``,
  ``metrics``, ...).

Sizes are checked at construction, so a mismatch fails where it is made, not three stages later.
The API is verl's (``verl.protocol``); where rlvr checks something verl asserts, the error is also
an ``AssertionError`` (see ``rlvr.utils.errors``). ``docs/verl_compat.md`` lists the differences;
the key names rlvr uses are listed in ``docs/DEV_CONTRACT.md``.
"""

from __future__ import annotations

import copy
import os
import pickle
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from rlvr.utils.dataproto_config import DataProtoConfig, auto_padding
from rlvr.utils.dataproto_ops import (
    chunk_sizes,
    compact_tensor,
    index_tensor,
    merge_meta_info,
    tensordict_from,
    to_object_array,
    union_meta_info,
    union_numpy_dict,
    union_tensor_dict,
)
from rlvr.utils.dataproto_reshape import (
    cat_rows,
    collate_fn,
    fold_batch_dim,
    from_tensordict,
    iterate_mini_batches,
    list_of_dict_to_dict_of_list,
    pad_dataproto_to_divisor,
    to_tensordict,
    unfold_batch_dim,
    unfold_column_chunks,
    unpad_dataproto,
)
from rlvr.utils.dataproto_serialize import (
    deserialize_single_tensor,
    deserialize_tensordict,
    serialize_single_tensor,
    serialize_tensordict,
)
from rlvr.utils.errors import ProtocolError, ProtocolKeyError, ProtocolTypeError
from rlvr.utils.files import replaced_atomically
from rlvr.utils.futures import DataProtoFuture

__all__ = [
    "DataProto",
    "DataProtoConfig",
    "DataProtoFuture",
    "DataProtoItem",
    "auto_padding",
    "collate_fn",
    "deserialize_single_tensor",
    "deserialize_tensordict",
    "fold_batch_dim",
    "list_of_dict_to_dict_of_list",
    "pad_dataproto_to_divisor",
    "serialize_single_tensor",
    "serialize_tensordict",
    "unfold_batch_dim",
    "union_numpy_dict",
    "union_tensor_dict",
    "unpad_dataproto",
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
            arrays at construction; None means no keys).
        meta_info: batch-level values; ``meta_info["metrics"]`` maps a metric name to a float or a
            list of floats.

    Raises (at construction):
        ProtocolError: tensors or arrays disagree on the batch size (the message names the key).
        ProtocolTypeError: a value has the wrong type (e.g. a tensor in ``non_tensor_batch``).
    """

    batch: TensorDict | None = None
    non_tensor_batch: dict[str, np.ndarray] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.batch, dict):
            self.batch = tensordict_from(self.batch)
        self.non_tensor_batch = {
            key: to_object_array(value) if isinstance(value, (list, tuple)) else value
            for key, value in (self.non_tensor_batch or {}).items()
        }
        self.meta_info = {} if self.meta_info is None else self.meta_info
        self.check_consistency()

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_dict(
        cls,
        tensors: dict[str, torch.Tensor] | None = None,
        non_tensors: dict[str, np.ndarray | list] | None = None,
        meta_info: dict[str, Any] | None = None,
        num_batch_dims: int = 1,
        auto_padding: bool = False,
    ) -> DataProto:
        """Build a DataProto from ``{key: tensor [batch, ...]}`` and ``{key: array/list [batch]}``.

        Args:
            num_batch_dims: must be 1 (a DataProto has one batch dim; verl asserts the same).
            auto_padding: turn auto padding on for this DataProto (see ``DataProtoConfig``).
        """
        if num_batch_dims != 1:
            raise ProtocolError(
                f"a DataProto has one batch dim; num_batch_dims={num_batch_dims} is not supported "
                "(group rows with rlvr.protocol.fold_batch_dim instead)"
            )
        if non_tensors is not None and not isinstance(non_tensors, dict):
            raise ProtocolTypeError(f"non_tensors must be a dict, got {type(non_tensors).__name__}")
        batch = tensordict_from(tensors) if tensors else None
        meta = dict(meta_info or {})
        if auto_padding:
            meta[DataProtoConfig.auto_padding_key] = True
        return cls(batch=batch, non_tensor_batch=dict(non_tensors or {}), meta_info=meta)

    @classmethod
    def from_single_dict(
        cls, data: dict[str, Any], meta_info: dict[str, Any] | None = None, auto_padding: bool = False
    ) -> DataProto:
        """Build a DataProto from one dict, sending tensors to ``batch`` and everything else
        (numpy arrays, lists) to ``non_tensor_batch``."""
        tensors = {k: v for k, v in data.items() if isinstance(v, torch.Tensor)}
        non_tensors = {k: v for k, v in data.items() if not isinstance(v, torch.Tensor)}
        return cls.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta_info, auto_padding=auto_padding)

    @classmethod
    def from_tensordict(
        cls, tensor_dict: TensorDict, meta_info: dict[str, Any] | None = None, num_batch_dims: int = 1
    ) -> DataProto:
        """The inverse of :meth:`to_tensordict` (``NonTensorStack`` -> non-tensor column,
        ``NonTensorData`` -> ``meta_info``)."""
        return from_tensordict(cls, tensor_dict, meta_info, num_batch_dims)

    def to_tensordict(self) -> TensorDict:
        """One ``TensorDict [batch]`` holding the tensors, the non-tensor columns (``NonTensorStack``)
        and the ``meta_info`` entries (``NonTensorData``)."""
        return to_tensordict(self)

    def check_consistency(self) -> None:
        """Check that every tensor and every non-tensor array has the same batch size.

        Raises:
            ProtocolError / ProtocolTypeError: naming the offending key and the sizes found.
        """
        if self.batch is not None:
            if not isinstance(self.batch, TensorDict):
                raise ProtocolTypeError(
                    f"DataProto.batch must be a TensorDict or None, got {type(self.batch).__name__}"
                )
            if self.batch.batch_dims != 1:
                raise ProtocolError(
                    f"DataProto.batch must have exactly one batch dim, got batch_size={list(self.batch.batch_size)}"
                )
        expected = len(self) if self.batch is not None else None
        reference = "the tensor batch"
        for key, value in self.non_tensor_batch.items():
            if isinstance(value, torch.Tensor):
                raise ProtocolTypeError(f"non_tensor_batch['{key}'] is a torch.Tensor; put tensors in batch instead")
            if not isinstance(value, np.ndarray):
                raise ProtocolTypeError(
                    f"non_tensor_batch['{key}'] must be a numpy array or a list, got {type(value).__name__}"
                )
            if value.ndim == 0:
                raise ProtocolError(f"non_tensor_batch['{key}'] is a 0-dim array; it needs one entry per sample")
            if expected is None:
                expected, reference = value.shape[0], f"non_tensor_batch['{list(self.non_tensor_batch)[0]}']"
            elif value.shape[0] != expected:
                raise ProtocolError(
                    f"batch size mismatch: non_tensor_batch['{key}'] has {value.shape[0]} entries "
                    f"but {reference} has {expected}"
                )
        if not isinstance(self.meta_info, dict):
            raise ProtocolTypeError(f"DataProto.meta_info must be a dict, got {type(self.meta_info).__name__}")

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
        raise ProtocolTypeError(
            f"DataProto indices must be int, slice, list, numpy array or tensor, not {type(item).__name__}"
        )

    def __iter__(self) -> Iterator[DataProtoItem]:
        for i in range(len(self)):
            yield self[i]

    def slice(self, start: int | None = None, end: int | None = None, step: int | None = None) -> DataProto:
        """Rows ``start:end:step`` as a view (tensors share storage with ``self``)."""
        rows = slice(start, end, step)
        batch = self.batch[rows] if self.batch is not None else None
        non_tensor = {key: value[rows] for key, value in self.non_tensor_batch.items()}
        return type(self)(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(self.meta_info))

    def select_idxs(self, idxs: Any) -> DataProto:
        """Rows picked by an index list / array / tensor, or by a boolean mask ``[batch]`` (copies)."""
        index = index_tensor(idxs, len(self))
        batch = self.batch[index] if self.batch is not None else None
        np_index = index.cpu().numpy()
        non_tensor = {key: value[np_index] for key, value in self.non_tensor_batch.items()}
        return type(self)(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(self.meta_info))

    # ------------------------------------------------------------------ key operations
    def _missing(self, keys: Sequence[str], available: Sequence[str], where: str) -> None:
        missing = [k for k in keys if k not in available]
        if missing:
            raise ProtocolKeyError(f"{where} has no key(s) {missing}; available: {sorted(available)}")

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
        return type(self)(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)

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
        return type(self).from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta)

    def rename(self, old_keys: str | list[str] | None = None, new_keys: str | list[str] | None = None) -> DataProto:
        """Rename tensor keys of ``batch`` in place (``old_keys[i]`` -> ``new_keys[i]``) and return ``self``."""
        old, new = ([keys] if isinstance(keys, str) else keys for keys in (old_keys, new_keys))
        if not isinstance(old, list) or not isinstance(new, list):
            raise ProtocolTypeError(f"old_keys and new_keys must be a str or a list, got {old_keys!r} and {new_keys!r}")
        if len(old) != len(new):
            raise ProtocolError(f"rename needs as many new keys as old keys, got {len(new)} and {len(old)}")
        self._missing(old, list(self.batch.keys()) if self.batch is not None else [], "batch")
        for old_key, new_key in zip(old, new, strict=True):
            self.batch.rename_key_(old_key, new_key)
        return self

    def union(self, other: DataProto) -> DataProto:
        """Add ``other``'s keys to ``self`` in place and return ``self``.

        Raises:
            ProtocolError: the lengths differ, or a key present in both holds different values.
        """
        if len(self) and len(other) and len(self) != len(other):
            raise ProtocolError(f"cannot union DataProtos of lengths {len(self)} and {len(other)}")
        if other.batch is not None:
            self.batch = other.batch.clone(False) if self.batch is None else union_tensor_dict(self.batch, other.batch)
        union_numpy_dict(self.non_tensor_batch, other.non_tensor_batch)
        union_meta_info(self.meta_info, other.meta_info)
        self.check_consistency()
        return self

    # ------------------------------------------------------------------ splitting and joining
    def is_padding_enabled(self) -> bool:
        """Whether this DataProto may be chunked unevenly and padded at dispatch (its own
        ``meta_info`` flag, or ``DataProtoConfig.auto_padding``)."""
        return bool(self.meta_info.get(DataProtoConfig.auto_padding_key, False)) or DataProtoConfig.auto_padding

    def padding(self, padding_size: int, padding_candidate: str = "") -> None:
        """Append ``padding_size`` copies of the first (``"first"``) or last (``"last"``, or ``""``
        as verl's default) row, in place."""
        if padding_candidate not in ("first", "last", ""):
            raise ProtocolError(f"padding_candidate must be 'first' or 'last', got {padding_candidate!r}")
        if padding_size < 0 or (padding_size and not len(self)):
            raise ProtocolError(f"cannot add {padding_size} padding rows to a DataProto of length {len(self)}")
        if padding_size == 0:
            return
        row = 0 if padding_candidate == "first" else len(self) - 1
        padded = cat_rows([self, self.select_idxs(torch.full((padding_size,), row))], self.meta_info)
        self.batch, self.non_tensor_batch = padded.batch, padded.non_tensor_batch

    def chunk(self, chunks: int) -> list[DataProto]:
        """Split into ``chunks`` parts (views). The length must divide by ``chunks`` unless auto
        padding is enabled; then the parts have ``ceil(len / chunks)`` rows, the last ones fewer.

        Raises:
            ProtocolError: not divisible; pad first with :func:`pad_dataproto_to_divisor` and drop the
                padding after the call with :func:`unpad_dataproto` (or enable auto padding).
        """
        if not isinstance(chunks, int) or chunks <= 0:
            raise ProtocolError(f"chunks must be a positive int, got {chunks!r}")
        if len(self) % chunks and not self.is_padding_enabled():
            raise ProtocolError(
                f"cannot chunk a DataProto of length {len(self)} into {chunks} equal parts; pad it with "
                f"rlvr.protocol.pad_dataproto_to_divisor(data, {chunks}) first and unpad the result"
            )
        starts = np.cumsum([0, *chunk_sizes(len(self), chunks)])
        return [self.slice(int(a), int(b)) for a, b in zip(starts[:-1], starts[1:], strict=True)]

    def split(self, split_size: int) -> list[DataProto]:
        """Split into consecutive parts of ``split_size`` rows (the last part may be shorter)."""
        if split_size <= 0:
            raise ProtocolError(f"split_size must be positive, got {split_size}")
        return [self.slice(start, start + split_size) for start in range(0, len(self), split_size)]

    @staticmethod
    def concat(data: Sequence[DataProto]) -> DataProto:
        """Join DataProtos row-wise (all must have the same keys and dtypes).

        ``meta_info["metrics"]`` (a dict or a list of dicts per part) is merged into one dict:
        each metric name maps to the flat list of the values of all parts. Every other
        ``meta_info`` key is kept and must be equal in all parts that have it.
        """
        if not data:
            raise ProtocolError("DataProto.concat needs at least one DataProto")
        return cat_rows(data, merge_meta_info([d.meta_info for d in data]))

    def repeat(self, repeat_times: int = 2, interleave: bool = True) -> DataProto:
        """Repeat every row ``repeat_times`` times.

        ``interleave=True`` gives ``[a, a, b, b]`` (the ``n`` samples of a prompt stay together);
        ``interleave=False`` gives ``[a, b, a, b]``.
        """
        if repeat_times < 1:
            raise ProtocolError(f"repeat_times must be >= 1, got {repeat_times}")
        if interleave:
            index = torch.arange(len(self)).repeat_interleave(repeat_times)
        else:
            index = torch.arange(len(self)).repeat(repeat_times)
        return self.select_idxs(index)

    def sample_level_repeat(self, repeat_times: Sequence[int] | np.ndarray | torch.Tensor) -> DataProto:
        """Repeat row ``i`` ``repeat_times[i]`` times (interleaved): ``[3, 1]`` gives ``[a, a, a, b]``."""
        if not isinstance(repeat_times, (list, tuple, np.ndarray, torch.Tensor)):
            raise ProtocolTypeError(
                f"repeat_times must be a list, tuple, numpy array or tensor, got {type(repeat_times).__name__}"
            )
        counts = torch.as_tensor(np.asarray(repeat_times), dtype=torch.long)
        if counts.shape != (len(self),) or bool((counts < 0).any()):
            raise ProtocolError(
                f"repeat_times needs one count >= 0 per row ({len(self)}), got shape {list(counts.shape)}"
            )
        return self.select_idxs(torch.arange(len(self)).repeat_interleave(counts))

    def unfold_column_chunks(self, n_split: int, split_keys: Sequence[str] | None = None) -> DataProto:
        """Cut dim 1 of ``split_keys`` into ``n_split`` rows each; other keys are repeated ``n_split``
        times (see :func:`rlvr.utils.dataproto_reshape.unfold_column_chunks`)."""
        return unfold_column_chunks(self, n_split, split_keys)

    def reorder(self, indices: torch.Tensor | np.ndarray | list[int]) -> None:
        """Permute the rows in place: row ``i`` becomes old row ``indices[i]``."""
        index = index_tensor(indices, len(self))
        if index.numel() != len(self):
            raise ProtocolError(f"reorder needs {len(self)} indices, got {index.numel()}")
        reordered = self.select_idxs(index)
        self.batch, self.non_tensor_batch = reordered.batch, reordered.non_tensor_batch

    def make_iterator(
        self, mini_batch_size: int, epochs: int, seed: int | None = None, dataloader_kwargs: dict | None = None
    ) -> Iterator[DataProto]:
        """Mini-batches of ``mini_batch_size`` rows for ``epochs`` epochs, through a
        ``torch.utils.data.DataLoader`` over the rows (``dataloader_kwargs``, e.g. ``shuffle=True``,
        go to it; ``seed`` seeds its generator). Each mini-batch carries this ``meta_info``.
        """
        return iterate_mini_batches(self, mini_batch_size, epochs, seed, dataloader_kwargs)

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

    def save_to_disk(self, filepath: str | os.PathLike) -> None:
        """Write to ``filepath`` atomically (a temp file in the same folder, then a rename)."""
        path = os.path.abspath(os.fspath(filepath))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with replaced_atomically(path) as tmp, open(tmp, "wb") as f:
            pickle.dump(self, f, protocol=pickle.HIGHEST_PROTOCOL)

    @staticmethod
    def load_from_disk(filepath: str | os.PathLike) -> DataProto:
        """Read a DataProto written by :meth:`save_to_disk` (only load files you trust: pickle)."""
        with open(filepath, "rb") as f:
            data = pickle.load(f)
        if not isinstance(data, DataProto):
            raise ProtocolTypeError(f"{filepath} holds a {type(data).__name__}, not a DataProto")
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
        return f"{type(self).__name__}(len={len(self)}, {{{', '.join(parts)}}}, meta_info={sorted(self.meta_info)})"
