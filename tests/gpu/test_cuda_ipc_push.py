"""The CUDA IPC weight push on a GPU: a rollout process on the same GPU gets a small model's weights
twice through the trainer's path (no host copy) and holds bit-identical copies each time; the push
time is printed (``-s``) and bounded."""

from __future__ import annotations

import pytest
import torch

from benchmarks.bench_weight_push import build_model, push_all

pytestmark = pytest.mark.gpu


def test_two_pushes_through_cuda_ipc_reach_the_child_bit_identical():
    device = torch.device("cuda", 0)
    model = build_model("tiny", device)
    result = push_all(model, device, repeats=3)
    assert result["path"] == "cuda ipc"
    assert [p["bit_identical"] for p in result["pushes"]] == [True, True, True]
    for push in result["pushes"]:
        print(f"cuda ipc push {push['version']}: blocking {push['blocking_s'] * 1e3:.2f} ms, "
              f"confirmed {push['confirm_s'] * 1e3:.2f} ms, {push['bytes'] / 1e6:.1f} MB")
    later = result["pushes"][1:]  # the first also opens the buffer in the child
    assert all(p["confirm_s"] < 1.0 for p in later)


def test_cpu_weights_and_weights_on_another_device_fall_back_to_shared_memory():
    from rlvr.trainer.async_schedule.weight_push import WeightPacker
    from rlvr.workers.rollout.shared_weights import SharedWeights

    packer = WeightPacker(on_ray=False, rollout_device="cuda:0")
    try:
        assert isinstance(packer.pack({"w": torch.ones(4)}), SharedWeights)
        if torch.cuda.device_count() > 1:
            assert isinstance(packer.pack({"w": torch.ones(4, device="cuda:1")}), SharedWeights)
            assert packer.path == "shared memory (from the device)"
    finally:
        packer.close()
