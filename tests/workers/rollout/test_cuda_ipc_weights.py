"""The CUDA IPC weight push without a GPU: the layout and views helper both pushes share, the handle
protocol (with stand-ins for torch's tensor sharing and the interprocess event), and the rollout's
inbox taking the handle. The GPU itself is covered by tests/gpu/test_cuda_ipc_push.py."""

from __future__ import annotations

import math
import pickle

import pytest
import torch

from rlvr.workers.rollout import cuda_ipc_weights
from rlvr.workers.rollout.cuda_ipc_weights import CudaIpcWeights, CudaIpcWeightsWriter
from rlvr.workers.rollout.shared_weights import (
    ALIGN,
    SharedWeights,
    WeightsHandle,
    layout_of,
    plan,
    tensor_views,
)
from tests.workers.rollout.weight_handles import (
    check_inbox_reads_idle_and_copies_out_while_generating,
    weights,
)

_SHARED: dict[int, torch.Tensor] = {}
"""The stand-in for CUDA IPC: tensors "shared" by id (one process)."""
EVENTS: list[str] = []
"""What the stand-in events saw, in order: ``record`` (trainer) and ``wait`` (rollout)."""


def _rebuild(key: int) -> torch.Tensor:
    return _SHARED[key]


def fake_share(tensor: torch.Tensor) -> tuple:
    _SHARED[id(tensor)] = tensor
    return _rebuild, (id(tensor),)


class _Event:
    def record(self) -> None:
        EVENTS.append("record")

    def wait(self) -> None:
        EVENTS.append("wait")


def _open_event() -> _Event:
    return _Event()


def fake_event(device: torch.device) -> tuple:
    return _Event(), (_open_event, ())


@pytest.fixture(autouse=True)
def _clean():
    EVENTS.clear()
    cuda_ipc_weights.forget_opened()
    yield
    cuda_ipc_weights.forget_opened()
    _SHARED.clear()


def assert_same(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert list(got) == list(expected)
    for name, tensor in expected.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape
        assert torch.equal(got[name], tensor), name


def test_the_plan_aligns_every_tensor_and_the_views_read_back_what_was_written():
    entries, size = plan(layout_of(weights(1.0)))
    # by hand: 35 fp32 = 140 B at 0; 3 bf16 at 192 (140 -> 192); int64 at 256; empty at 320; 9 fp16 at 320
    assert [(name, offset) for name, offset, _, _ in entries] == [
        ("embed.weight", 0), ("norm.weight", 192), ("steps", 256), ("empty", 320), ("head.bias", 320)]
    assert size == 320 + 18 and all(offset % ALIGN == 0 for _, offset, _, _ in entries)
    assert entries[1][2:] == ((3,), "bfloat16")
    flat = torch.zeros(size, dtype=torch.uint8)
    for view, tensor in zip(tensor_views(flat, entries).values(), weights(2.0).values()):
        view.copy_(tensor)
    assert_same(tensor_views(flat, entries), weights(2.0))
    # the bytes are where the plan says: the first float of the embedding at 0, the int64 at 256
    assert flat[:4].view(torch.float32).item() == weights(2.0)["embed.weight"][0, 0].item()
    assert flat[256:264].view(torch.int64).item() == 11
    assert math.prod(tensor_views(flat, entries)["empty"].shape) == 0


def test_the_handle_is_small_picklable_and_gives_back_the_weights_after_the_trainers_event():
    writer = CudaIpcWeightsWriter(share=fake_share, new_event=fake_event)
    handle = writer.pack(weights(1.0))
    assert isinstance(handle, WeightsHandle) and len(pickle.dumps(handle)) < 2048
    handle = pickle.loads(pickle.dumps(handle))  # as it travels to the rollout process
    with handle.tensors() as views:
        assert EVENTS == ["record", "wait"]  # the reader waits on the event the writer recorded
        assert_same(views, weights(1.0))
    copies = handle.copy()
    again = writer.pack(weights(3.0))  # same layout: the same buffer, new values
    assert again.buffer_id == handle.buffer_id
    assert_same(copies, weights(1.0))  # private copies keep the old values
    with again.tensors() as views:
        assert_same(views, weights(3.0))
    other = writer.pack({**weights(1.0), "extra": torch.ones(2)})  # another layout: another buffer
    assert other.buffer_id != handle.buffer_id
    assert_same(other.copy(), {**weights(1.0), "extra": torch.ones(2)})
    assert list(cuda_ipc_weights._OPENED) == [other.buffer_id]  # the reader dropped the old buffer
    writer.close()


def test_the_reader_opens_a_buffer_once_per_layout():
    opened = []

    def counting_share(tensor):
        _, args = fake_share(tensor)
        return _count_rebuild, (args[0],)

    _COUNT.clear()
    writer = CudaIpcWeightsWriter(share=counting_share, new_event=fake_event)
    for scale in (1.0, 2.0, 3.0):
        with writer.pack(weights(scale)).tensors() as views:
            opened.append(views["embed.weight"][0, 0].item())
    assert _COUNT == [1] and opened == [weights(s)["embed.weight"][0, 0].item() for s in (1.0, 2.0, 3.0)]


_COUNT: list[int] = []


def _count_rebuild(key: int) -> torch.Tensor:
    _COUNT.append(1)
    return _SHARED[key]


def test_weights_on_several_devices_are_refused_with_the_devices_named():
    writer = CudaIpcWeightsWriter(share=fake_share, new_event=fake_event)
    with pytest.raises(ValueError, match=r"one device; got \['cpu', 'meta'\]"):
        writer.pack({"a": torch.ones(2), "b": torch.empty(2, device="meta")})


def test_the_inbox_reads_a_cuda_handle_at_once_when_idle_and_copies_it_out_while_generating():
    check_inbox_reads_idle_and_copies_out_while_generating(
        CudaIpcWeightsWriter(share=fake_share, new_event=fake_event))


def test_plain_weights_are_not_taken_for_a_handle():
    assert not isinstance(weights(1.0), WeightsHandle)  # a dict has copy() but no tensors()
    assert not isinstance(list(weights(1.0).items()), WeightsHandle)
    assert isinstance(SharedWeights("x", ()), WeightsHandle) and isinstance(
        CudaIpcWeights("id", (_rebuild, (0,)), (_open_event, ()), ()), WeightsHandle)
