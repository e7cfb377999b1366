"""Dispatch functions on a stand-in group (padding rules, futures, errors), the constructor
arguments verl passes, and the broadcast rule of ``execute_all`` (no Ray cluster needed)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from sc_workers import DemoWorker

from rlvr.protocol import DataProto, DataProtoConfig, DataProtoFuture
from rlvr.single_controller import ClassWithInitArgs, LocalResourcePool, LocalWorkerGroup, RankInfo
from rlvr.single_controller.base.dispatch import (
    PADDING_SIZE_KEY,
    collect_dp_compute,
    dispatch_dp_compute_data_proto,
    dispatch_dp_compute_data_proto_with_func,
    dispatch_dp_mp_dispatch_first,
)
from rlvr.single_controller.ray.base import RayResourcePool


@dataclass
class Group:
    """A stand-in worker group of ``world_size`` ranks with ``tp`` model-parallel ranks per dp rank."""

    world_size: int
    tp: int = 1

    def rank_infos(self) -> list[RankInfo]:
        return [RankInfo(r, self.world_size, r // self.tp, self.world_size // self.tp, r % self.tp, self.tp)
                for r in range(self.world_size)]


def batch(n: int) -> DataProto:
    return DataProto.from_dict(tensors={"x": torch.arange(n)})


def test_dp_compute_proto_pads_with_the_last_row_and_reports_it():
    data = batch(5)
    (parts,), kwargs = dispatch_dp_compute_data_proto(Group(2), data, scale=3)
    assert [p.batch["x"].tolist() for p in parts] == [[0, 1, 2], [3, 4, 4]]
    assert kwargs == {"scale": [3, 3], PADDING_SIZE_KEY: 1}
    assert data.batch["x"].tolist() == [0, 1, 2, 3, 4]  # the argument itself is not padded
    (parts,), kwargs = dispatch_dp_compute_data_proto(Group(2), batch(4))
    assert PADDING_SIZE_KEY not in kwargs and [len(p) for p in parts] == [2, 2]


def test_without_dispatch_padding_only_auto_padded_data_is_padded():
    DataProtoConfig.dispatch_padding = False
    try:
        with pytest.raises(AssertionError, match="cannot chunk a DataProto of length 5 into 2"):
            dispatch_dp_compute_data_proto(Group(2), batch(5))
        auto = DataProto.from_dict(tensors={"x": torch.arange(5)}, auto_padding=True)
        (parts,), kwargs = dispatch_dp_compute_data_proto(Group(2), auto)
        assert [p.batch["x"].tolist() for p in parts] == [[0, 1, 2], [3, 4, 4]] and kwargs[PADDING_SIZE_KEY] == 1
    finally:
        DataProtoConfig.dispatch_padding = True


def test_dispatch_errors_and_future_arguments():
    with pytest.raises(ValueError, match=r"same length, got \[2, 3\]"):
        dispatch_dp_compute_data_proto(Group(2), batch(2), batch(3))
    with pytest.raises(TypeError, match="needs a function first"):
        dispatch_dp_compute_data_proto_with_func(Group(2), batch(2))
    (func, parts), _ = dispatch_dp_compute_data_proto_with_func(Group(2), abs, batch(4))
    assert func == [abs, abs] and [p.batch["x"].tolist() for p in parts] == [[0, 1], [2, 3]]
    future = DataProtoFuture.concat([batch(2), batch(2)])
    (chunks,), _ = dispatch_dp_compute_data_proto(Group(2), future)  # a future is split, not resolved
    assert [c.get().batch["x"].tolist() for c in chunks] == [[0, 1], [0, 1]]
    with pytest.raises(ValueError, match=r"one output per rank \(2\), got 1"):
        collect_dp_compute(Group(2), [1])


def test_dp_mp_dispatch_first_keeps_padding_and_sends_to_tp_rank_zero():
    (parts,), kwargs = dispatch_dp_mp_dispatch_first(Group(4, tp=2), batch(3))
    assert [None if p is None else p.batch["x"].tolist() for p in parts] == [[0, 1], None, [2, 2], None]
    assert kwargs == {PADDING_SIZE_KEY: 1}


def test_verl_constructor_arguments():
    pool = RayResourcePool([2], True, "gpu_pool", 4, False, "A100")
    assert (pool.name_prefix, pool.max_colocate_count, pool.detached) == ("gpu_pool", 4, False)
    assert pool.bundle() == {"CPU": 0.1, "GPU": 1.0, "A100": 1e-4}
    assert RayResourcePool([1], use_gpu=False).bundle() == {"CPU": 0.1}
    assert RayResourcePool([1]).max_colocate_count == 10  # verl's default
    with pytest.raises(ValueError, match="cannot be detached"):
        LocalResourcePool([1], detached=True)
    with pytest.raises(ValueError, match="device_name='npu' is not supported"):
        LocalWorkerGroup(LocalResourcePool([1]), ClassWithInitArgs(DemoWorker), device_name="npu")
    with pytest.raises(ValueError, match="device_name='cpu' is not supported with use_gpu=True"):
        LocalWorkerGroup(LocalResourcePool([1], use_gpu=True), ClassWithInitArgs(DemoWorker), device_name="cpu")
    with pytest.raises(TypeError, match="a worker class"):
        ClassWithInitArgs(DemoWorker())


def test_execute_all_splits_only_when_every_argument_is_per_rank():
    group = LocalWorkerGroup(LocalResourcePool([1]), ClassWithInitArgs(DemoWorker), name_prefix="execute_rule")
    assert group.execute_all_sync("mul", [3], [4]) == [12]  # every argument a list of world_size: split
    assert group.execute_all_sync("mul", [3], factor=2) == [[3, 3]]  # mixed: every rank gets them all
    assert group.execute_all_async("add_rank", 5).get() == [5]
