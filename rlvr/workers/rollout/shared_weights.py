"""Weights pushed to a rollout process on the same machine through shared memory.

The local backend runs a rollout apart from the actor (``actor_rollout_ref.hybrid_engine=false``)
in a child process, and its calls travel pickled through a pipe. A whole policy sent that way
(SmolLM2-135M: 540 MB in fp32) cost 3-7 s per weight push on the 2-core CPU, a third of an
asynchronous step. Here the trainer copies the weights into one shared-memory segment instead
(:class:`SharedWeightsWriter`, reused while the parameter layout stays) and sends only a handle
(:class:`SharedWeights`: the segment's name and where each tensor lies, a few KB); the rollout
process maps the segment and copies the tensors into its engine.

The trainer writes the segment again at its next push, so a handle is only valid until then: the
rollout reads it during the ``update_weights`` call that brought it (the push runs in the background,
and the trainer waits for that call's reply before it pushes again:
:class:`rlvr.trainer.async_schedule.weight_push.BackgroundPush`), and weights that must wait for the
end of a generation are copied out of the segment first
(:func:`rlvr.workers.rollout.partial.WeightInbox.deliver`, which takes any :class:`WeightsHandle`).
The layout (:func:`plan`) and the views (:func:`tensor_views`) serve the CUDA IPC push too
(:mod:`rlvr.workers.rollout.cuda_ipc_weights`), whose buffer lives on the GPU.

Cleanup: the writer unlinks its segment on :meth:`SharedWeightsWriter.close`, when it is garbage
collected or at interpreter exit (``weakref.finalize``), and (Python's resource tracker) when the
trainer is killed. A trainer killed with its resource tracker (``kill -9`` of the process group)
leaves its segment; the next writer on the machine removes it (:func:`remove_orphans`). The
rollout process maps the segment without registering it, so its exit leaves the segment alone.
"""

from __future__ import annotations

import contextlib
import glob
import math
import os
import shutil
import uuid
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from multiprocessing import resource_tracker, shared_memory
from typing import Protocol, runtime_checkable

import torch

__all__ = ["SharedWeights", "SharedWeightsWriter", "WeightsHandle", "SHM_DIR", "remove_orphans", "layout_of", "plan",
           "tensor_views"]

SHM_DIR = "/dev/shm"
PREFIX = "rlvr_w_"
"""Segment names: ``rlvr_w_<pid of the trainer>_<random>``."""
ALIGN = 64
"""Byte alignment of every tensor in the segment (a cache line; every dtype's alignment divides it)."""
HEADROOM = 256 << 20
"""Bytes that must stay free in ``SHM_DIR`` beside the segment; with less, weights go by value."""
_CREATED: set[str] = set()
"""Segments this process made (and still has)."""


@runtime_checkable
class WeightsHandle(Protocol):
    """Weights that stay in the trainer's buffer and travel as a handle: :class:`SharedWeights`, or
    :class:`~rlvr.workers.rollout.cuda_ipc_weights.CudaIpcWeights` (valid until the next push)."""

    def tensors(self) -> contextlib.AbstractContextManager[dict[str, torch.Tensor]]:
        """Views of the buffer, valid inside the block only."""
        ...

    def copy(self) -> dict[str, torch.Tensor]:
        """Private copies of the tensors (weights that outlive the pushing call)."""
        ...


@dataclass(frozen=True)
class SharedWeights:
    """A handle to weights in a shared-memory segment (picklable, a few KB).

    Attributes:
        segment: the segment's name.
        entries: ``(parameter name, byte offset, shape, dtype name)`` for every tensor.
    """

    segment: str
    entries: tuple[tuple[str, int, tuple[int, ...], str], ...]

    @contextlib.contextmanager
    def tensors(self) -> Iterator[dict[str, torch.Tensor]]:
        """The tensors as views of the segment, valid inside the block only (the segment is
        unmapped after it; the trainer may overwrite it at its next push)."""
        shm = _attach(self.segment)
        views = {}
        try:
            views = _segment_views(shm.buf, self.entries)
            yield views
        finally:
            views.clear()
            shm.close()

    def copy(self) -> dict[str, torch.Tensor]:
        """Private copies of the tensors (for weights that must outlive the pushing call)."""
        with self.tensors() as views:
            return {name: view.clone() for name, view in views.items()}


class SharedWeightsWriter:
    """The trainer's side: :meth:`pack` copies weights into the segment and returns the handle."""

    def __init__(self) -> None:
        self._shm: shared_memory.SharedMemory | None = None
        self._release: weakref.finalize | None = None
        self._layout: tuple | None = None
        self._entries: tuple = ()

    def pack(self, weights: Mapping[str, torch.Tensor]) -> SharedWeights | Mapping[str, torch.Tensor]:
        """Copy ``weights`` (CPU tensors) into the segment (created, or re-created when the names,
        shapes or dtypes change) and return its handle; ``weights`` themselves when ``SHM_DIR`` has
        too little room (they then travel by value, as before)."""
        layout = layout_of(weights)
        if layout != self._layout:
            self.close()
            entries, size = plan(layout)
            if shutil.disk_usage(SHM_DIR).free < size + HEADROOM:
                return weights
            remove_orphans()
            self._shm = shared_memory.SharedMemory(name=f"{PREFIX}{os.getpid()}_{uuid.uuid4().hex[:12]}", create=True,
                                                   size=max(size, 1))
            _CREATED.add(self._shm.name)
            self._release = weakref.finalize(self, _release, self._shm)  # also at interpreter exit
            self._layout, self._entries = layout, entries
        targets = _segment_views(self._shm.buf, self._entries)
        for target, tensor in zip(targets.values(), weights.values()):
            target.copy_(tensor.detach())
        targets.clear()  # the segment can only be unmapped once no view of it is left
        return SharedWeights(self._shm.name, self._entries)

    def close(self) -> None:
        """Unmap and remove the segment (handles given out stop working)."""
        if self._release is not None:
            self._release()
        self._shm, self._release, self._layout, self._entries = None, None, None, ()


def layout_of(weights: Mapping[str, torch.Tensor]) -> tuple:
    """``(name, shape, dtype)`` of every tensor: a buffer laid out for one layout serves every push of it."""
    return tuple((name, tuple(t.shape), t.dtype) for name, t in weights.items())


def plan(layout: tuple) -> tuple[tuple, int]:
    """Byte offsets of the tensors of ``layout`` in one flat buffer, each aligned to ``ALIGN``.

    Returns ``(entries, size)``: ``(name, offset, shape, dtype name)`` per tensor and the bytes needed.
    """
    entries, offset = [], 0
    for name, shape, dtype in layout:
        offset = -(-offset // ALIGN) * ALIGN
        entries.append((name, offset, shape, str(dtype).removeprefix("torch.")))
        offset += math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    return tuple(entries), offset


def tensor_views(flat: torch.Tensor, entries: tuple) -> dict[str, torch.Tensor]:
    """The tensors of ``entries`` as views of ``flat`` (a 1-D ``uint8`` tensor ``[size]`` on any
    device: the shared-memory segment, or the CUDA buffer of :mod:`rlvr.workers.rollout.cuda_ipc_weights`)."""
    views = {}
    for name, offset, shape, dtype in entries:
        dt = getattr(torch, dtype)
        nbytes = math.prod(shape) * torch.empty((), dtype=dt).element_size()
        views[name] = flat[offset:offset + nbytes].view(dt).view(shape)
    return views


def _segment_views(buf: memoryview, entries: tuple) -> dict[str, torch.Tensor]:
    """:func:`tensor_views` of a mapped segment (the views hold it mapped until they are dropped)."""
    return tensor_views(torch.frombuffer(buf, dtype=torch.uint8), entries)


def remove_orphans() -> list[str]:
    """Remove the segments of trainers that no longer run (their pid is in the name): a trainer killed
    together with its resource tracker (``kill -9`` of its process group) cannot remove its own.
    Returns the names removed."""
    removed = []
    for path in glob.glob(os.path.join(SHM_DIR, PREFIX + "*")):
        name = os.path.basename(path)
        pid = name[len(PREFIX):].split("_", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                removed.append(name)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _release(shm: shared_memory.SharedMemory) -> None:
    _CREATED.discard(shm.name)
    shm.close()
    shm.unlink()


def _attach(name: str) -> shared_memory.SharedMemory:
    """Map an existing segment without handing it to this process's resource tracker (which would
    remove it when this process exits, under the trainer that made it). In the process that made
    it (a rollout worker in the trainer's process), the maker's registration stays."""
    try:
        return shared_memory.SharedMemory(name=name, track=False)  # Python >= 3.13
    except TypeError:
        shm = shared_memory.SharedMemory(name=name)
        if name not in _CREATED:
            resource_tracker.unregister(shm._name, "shared_memory")  # noqa: SLF001 - the name it registered
        return shm
