"""Weights pushed to the local rollout process through shared memory: what the handle carries, what
the other process reads, when the segment goes away, and the fallback when /dev/shm is small."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from rlvr.workers.rollout import shared_weights
from rlvr.workers.rollout.shared_weights import SharedWeights, SharedWeightsWriter
from tests.workers.rollout.weight_handles import (
    check_inbox_reads_idle_and_copies_out_while_generating,
    weights,
)

pytestmark = pytest.mark.skipif(not os.path.isdir(shared_weights.SHM_DIR), reason="no /dev/shm")


def segment_exists(handle: SharedWeights) -> bool:
    return os.path.exists(os.path.join(shared_weights.SHM_DIR, handle.segment))


def assert_same(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert list(got) == list(expected)
    for name, tensor in expected.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape
        assert torch.equal(got[name], tensor), name


def test_the_handle_is_small_and_gives_back_the_weights_exactly():
    writer = SharedWeightsWriter()
    try:
        handle = writer.pack(weights(1.0))
        assert isinstance(handle, SharedWeights) and len(pickle.dumps(handle)) < 1024
        assert all(offset % shared_weights.ALIGN == 0 for _, offset, _, _ in handle.entries)
        assert_same(handle.copy(), weights(1.0))
        with handle.tensors() as views:
            assert_same(views, weights(1.0))
        again = writer.pack(weights(2.0))  # same layout: the same segment, new values
        assert again == handle
        assert_same(handle.copy(), weights(2.0))
        other = writer.pack({**weights(1.0), "extra": torch.ones(2)})  # another layout: a new segment
        assert other.segment != handle.segment and not segment_exists(handle) and segment_exists(other)
    finally:
        writer.close()
    assert not segment_exists(other)


def test_another_process_reads_the_weights_and_its_exit_leaves_the_segment(tmp_path):
    writer = SharedWeightsWriter()
    try:
        handle = writer.pack(weights(3.0))
        (tmp_path / "handle.pkl").write_bytes(pickle.dumps(handle))
        code = ("import pickle, sys, torch; handle = pickle.load(open(sys.argv[1], 'rb')); "
                "torch.save(handle.copy(), sys.argv[2])")
        subprocess.run([sys.executable, "-c", code, str(tmp_path / "handle.pkl"), str(tmp_path / "read.pt")],
                       check=True, timeout=120, capture_output=True)
        assert_same(torch.load(tmp_path / "read.pt"), weights(3.0))
        assert segment_exists(handle)  # the reader did not hand it to its resource tracker
        assert_same(handle.copy(), weights(3.0))
    finally:
        writer.close()


def test_weights_go_by_value_when_shared_memory_has_too_little_room(monkeypatch):
    monkeypatch.setattr(shared_weights.shutil, "disk_usage", lambda path: SimpleNamespace(free=shared_weights.HEADROOM))
    given = weights(1.0)
    assert SharedWeightsWriter().pack(given) is given


def test_weights_that_wait_for_a_generation_are_copied_out_before_the_trainer_writes_again():
    writer = SharedWeightsWriter()
    try:
        check_inbox_reads_idle_and_copies_out_while_generating(writer)
    finally:
        writer.close()


def test_the_segment_of_a_trainer_killed_with_its_resource_tracker_is_removed_by_the_next_writer(tmp_path):
    code = ("import os, signal, torch; from rlvr.workers.rollout.shared_weights import SharedWeightsWriter; "
            "writer = SharedWeightsWriter(); print(writer.pack({'a': torch.ones(4)}).segment, flush=True); "
            "os.killpg(0, signal.SIGKILL)")  # the trainer and its resource tracker at once
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                           start_new_session=True)
    orphan = child.stdout.strip()
    assert orphan.startswith("rlvr_w_") and os.path.exists(os.path.join(shared_weights.SHM_DIR, orphan))
    writer = SharedWeightsWriter()
    try:
        mine = writer.pack(weights(1.0))
        assert not os.path.exists(os.path.join(shared_weights.SHM_DIR, orphan))
        assert mine.segment.startswith(f"rlvr_w_{os.getpid()}_")
        assert shared_weights.remove_orphans() == []  # a live trainer's segment stays
        assert segment_exists(mine)
    finally:
        writer.close()
