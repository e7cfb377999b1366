"""verl's tensor and TensorDict serialisers (``verl.protocol.serialize_*``): tensors as raw bytes
with their dtype and shape, which pickle and Ray move without ``torch.save``.

A tensor is ``(dtype name, shape, uint8 numpy array of its bytes)``; a jagged / strided nested
tensor is ``(layout name, [one such triple per row])``; a TensorDict is ``(batch size, device or
None, {key: encoded tensor})``. Deserialising copies the bytes, so the result owns its memory.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict

from rlvr.utils.errors import ProtocolError

__all__ = ["deserialize_single_tensor", "deserialize_tensordict", "serialize_single_tensor", "serialize_tensordict"]

EncodedTensor = tuple[str, tuple[int, ...], Any]


def serialize_single_tensor(obj: torch.Tensor) -> EncodedTensor:
    """``(dtype, shape, bytes)`` of a CPU tensor (``"float32"``, ``torch.Size``, uint8 numpy view)."""
    raw = obj.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
    return str(obj.dtype).removeprefix("torch."), obj.shape, raw


def deserialize_single_tensor(arr: EncodedTensor) -> torch.Tensor:
    """The tensor of :func:`serialize_single_tensor`'s triple (a copy of the bytes)."""
    dtype_name, shape, raw = arr
    dtype = getattr(torch, dtype_name, None)
    if not isinstance(dtype, torch.dtype):
        raise ProtocolError(f"{dtype_name!r} is not a torch dtype; the encoding is damaged")
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).view(shape)


def serialize_tensordict(batch: TensorDict) -> tuple[tuple[int, ...], str | None, dict[str, Any]]:
    """``(batch size, device, {key: encoded})`` of a TensorDict of tensors and nested tensors."""
    encoded: dict[str, Any] = {}
    for key, value in batch.items():
        if value.is_nested:
            encoded[key] = (str(value.layout).removeprefix("torch."), [serialize_single_tensor(row) for row in value.unbind()])
        else:
            encoded[key] = serialize_single_tensor(value)
    return tuple(batch.batch_size), str(batch.device) if batch.device is not None else None, encoded


def deserialize_tensordict(arr: tuple[tuple[int, ...], str | None, dict[str, Any]]) -> TensorDict:
    """The TensorDict of :func:`serialize_tensordict`'s triple.

    Raises:
        ValueError: an item that is neither a tensor's triple nor a nested tensor's pair.
    """
    batch_size, device, encoded = arr
    items: dict[str, torch.Tensor] = {}
    for key, value in encoded.items():
        if len(value) == 3:
            items[key] = deserialize_single_tensor(value)
        elif len(value) == 2:
            layout, rows = value
            items[key] = torch.nested.as_nested_tensor([deserialize_single_tensor(row) for row in rows],
                                                       layout=getattr(torch, layout))
        else:
            raise ValueError(f"{key}: an encoded tensor has 3 parts (dtype, shape, bytes) and a nested one 2 "
                             f"(layout, rows); got {len(value)}")
    return TensorDict(source=items, batch_size=batch_size, device=device)
