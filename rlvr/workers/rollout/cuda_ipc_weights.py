"""Weights pushed to a rollout process on the same GPU through CUDA IPC, without a host copy.

The shared-memory push (:mod:`rlvr.workers.rollout.shared_weights`) serves a CPU actor; an actor on a
GPU with its rollout child on the same GPU would take its weights GPU -> host -> child -> GPU (3.0 s
per push of SmolLM2-135M on an H200). Here the trainer keeps one CUDA buffer, laid out as the
segment is (:func:`~rlvr.workers.rollout.shared_weights.plan`, reused while the parameter layout
stays), copies the parameters into it device to device, records an interprocess CUDA event after the
copies and sends a handle (:class:`CudaIpcWeights`, a few KB): the buffer's IPC handle (torch's
``reduce_tensor``), the event's IPC handle and where each tensor lies. The rollout process opens the
buffer once per layout (cached), makes its stream wait on the event, copies the views into its
engine and waits for its copies to finish before the ``update_weights`` call returns, so the
trainer may write the buffer again once that call has replied.

As with shared memory, a handle is only valid until the trainer's next push (the trainer waits for
the ``update_weights`` reply of a push before the next one writes the buffer), and weights that must
wait for the end of a generation are copied out first (:meth:`CudaIpcWeights.copy`).

Cleanup: the buffer lives as long as its writer (:meth:`CudaIpcWeightsWriter.close`, or garbage
collection); a rollout process drops its mapping of an older buffer when a new one arrives and at
:func:`forget_opened`. The CUDA driver releases the memory when the last process holding it ends.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from rlvr.workers.rollout.shared_weights import layout_of, plan, tensor_views

__all__ = ["CudaIpcWeights", "CudaIpcWeightsWriter", "forget_opened"]

Rebuild = tuple[Callable[..., Any], tuple]
"""A picklable ``(function, args)`` whose call gives the object back in another process."""


@dataclass(frozen=True)
class CudaIpcWeights:
    """A handle to weights in a CUDA buffer of another process on the same GPU (picklable, a few KB).

    Attributes:
        buffer_id: the writer's buffer (a new one per layout): the receiving process opens it once.
        buffer: rebuilds the flat ``uint8`` buffer ``[size]`` (torch's CUDA IPC ``reduce_tensor``).
        event: rebuilds the interprocess event recorded after the trainer's copies.
        entries: ``(parameter name, byte offset, shape, dtype name)`` for every tensor.
    """

    buffer_id: str
    buffer: Rebuild
    event: Rebuild
    entries: tuple[tuple[str, int, tuple[int, ...], str], ...]

    @contextlib.contextmanager
    def tensors(self) -> Iterator[dict[str, torch.Tensor]]:
        """The tensors as views of the buffer, valid inside the block only: the current stream of the
        buffer's device waits for the trainer's copies first, and the block's work on that stream
        (the copies into the engine) is finished when the block ends."""
        flat, event = _open(self)
        views: dict[str, torch.Tensor] = {}
        try:
            _wait(event, flat.device)
            views = tensor_views(flat, self.entries)
            yield views
        finally:
            views.clear()
            _finish(flat.device)

    def copy(self) -> dict[str, torch.Tensor]:
        """Private copies of the tensors, on the buffer's device (for weights that must outlive the
        pushing call)."""
        with self.tensors() as views:
            return {name: view.clone() for name, view in views.items()}


class CudaIpcWeightsWriter:
    """The trainer's side: :meth:`pack` copies CUDA weights into its buffer and returns the handle.

    Args:
        share: gives a tensor's picklable rebuild (default torch's CUDA IPC ``reduce_tensor``).
        new_event: makes the event of a buffer on a device: ``(event, rebuild)``, where ``event``
            has ``record()`` (default an interprocess ``torch.cuda.Event`` and its IPC handle).
    """

    def __init__(self, share: Callable[[torch.Tensor], Rebuild] | None = None,
                 new_event: Callable[[torch.device], tuple[Any, Rebuild]] | None = None) -> None:
        self._share = share or _reduce_cuda_tensor
        self._new_event = new_event or _ipc_event
        self._layout: tuple | None = None
        self._flat: torch.Tensor | None = None
        self._event: Any = None
        self._handle: CudaIpcWeights | None = None

    def pack(self, weights: Mapping[str, torch.Tensor]) -> CudaIpcWeights:
        """Copy ``weights`` (tensors on one device) into the buffer on that device (made, or made
        again when the names, shapes, dtypes or the device change), record the event after the
        copies (on the current stream) and return the handle. The copies are enqueued, not waited
        for: the weights may be the actor's own, changed later on the same stream."""
        devices = {t.device for t in weights.values()}
        if len(devices) != 1:
            raise ValueError(f"CUDA IPC weights must all be on one device; got {sorted(map(str, devices))}")
        device = devices.pop()
        layout = (device, layout_of(weights))
        if layout != self._layout:
            self.close()
            entries, size = plan(layout[1])
            self._flat = torch.empty(max(size, 1), dtype=torch.uint8, device=device)
            self._event, event_rebuild = self._new_event(device)
            self._handle = CudaIpcWeights(uuid.uuid4().hex, self._share(self._flat), event_rebuild, entries)
            self._layout = layout
        targets = tensor_views(self._flat, self._handle.entries)
        with torch.no_grad():
            for target, tensor in zip(targets.values(), weights.values()):
                target.copy_(tensor.detach(), non_blocking=True)
        self._event.record()
        return self._handle

    def close(self) -> None:
        """Drop the buffer (handles given out stop working once the receivers drop theirs)."""
        self._layout = self._flat = self._event = self._handle = None


# ---------------------------------------------------------------------------- CUDA specifics
def _reduce_cuda_tensor(tensor: torch.Tensor) -> Rebuild:
    from torch.multiprocessing.reductions import reduce_tensor

    return reduce_tensor(tensor)


class _RecordedEvent:
    """An interprocess CUDA event recorded on the current stream of its device."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        with torch.cuda.device(device):
            self.event = torch.cuda.Event(interprocess=True)  # interprocess events never time

    def record(self) -> None:
        self.event.record(torch.cuda.current_stream(self.device))


def _ipc_event(device: torch.device) -> tuple[_RecordedEvent, Rebuild]:
    event = _RecordedEvent(device)
    with torch.cuda.device(device):
        handle = event.event.ipc_handle()
    return event, (_open_ipc_event, (device.index, handle))


def _open_ipc_event(device_index: int, handle: bytes) -> torch.cuda.Event:
    return torch.cuda.Event.from_ipc_handle(device_index, handle)


_OPENED: dict[str, tuple[torch.Tensor, Any]] = {}
"""The receiving process's open buffer and event, by ``buffer_id`` (the latest only)."""
_OPEN_LOCK = threading.Lock()


def _open(handle: CudaIpcWeights) -> tuple[torch.Tensor, Any]:
    """The buffer and event of ``handle``, opened once per buffer (an older buffer's are dropped)."""
    with _OPEN_LOCK:
        opened = _OPENED.get(handle.buffer_id)
        if opened is None:
            _OPENED.clear()
            fn, args = handle.buffer
            event_fn, event_args = handle.event
            opened = _OPENED[handle.buffer_id] = (fn(*args), event_fn(*event_args))
        return opened


def forget_opened() -> None:
    """Drop this process's mapping of the trainer's buffer (it is opened again at the next handle)."""
    with _OPEN_LOCK:
        _OPENED.clear()


def _wait(event: Any, device: torch.device) -> None:
    """The current stream of ``device`` waits for the trainer's copies (``event``)."""
    if device.type == "cuda":
        with torch.cuda.device(device):
            event.wait(torch.cuda.current_stream(device))
    else:  # a stand-in event (tests on a CPU)
        event.wait()


def _finish(device: torch.device) -> None:
    """Wait for the work queued on the current stream of ``device`` (the reads of the buffer)."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()
