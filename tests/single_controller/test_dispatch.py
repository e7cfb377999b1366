"""Every dispatch mode, async calls and torch.distributed, on the Ray backend (2 CPU workers) and locally."""

from __future__ import annotations

import pytest
import ray
import torch
import torch.distributed as dist
from sc_workers import DemoWorker, world_size_of

from rlvr.protocol import DataProto
from rlvr.single_controller import ClassWithInitArgs, WorkerFuture


def batch(n: int) -> DataProto:
    """``x [n] = 0..n-1``."""
    return DataProto.from_dict(tensors={"x": torch.arange(n, dtype=torch.float32)})


def test_every_dispatch_mode(demo):
    backend, group = demo
    n = world_size_of(backend)
    assert group.world_size == n
    infos = group.info()
    assert [i["rank"] for i in infos] == list(range(n))
    assert {i["world_size"] for i in infos} == {n} and {i["device"] for i in infos} == {"cpu"}
    assert len({i["pid"] for i in infos}) == n
    assert len({i["master"] for i in infos}) == 1 and infos[0]["master"][1] > 0

    assert group.add_rank(10) == [10, 11][:n]  # ONE_TO_ALL
    assert group.mul([1, 2][:n], factor=[3, 4][:n]) == [3, 8][:n]  # ALL_TO_ALL
    assert group.whoami("t") == ("t", 0)  # RANK_ZERO: rank 0's output, not a list
    assert group.only_rank_zero(5) == (5, 0)  # Execute.RANK_ZERO
    assert group.square([2, 3][:n]) == [4, 9][:n]  # DP_COMPUTE
    with pytest.raises(TypeError, match="one item per rank"):
        group.square([2, 3, 4])
    assert group.sum_list([1, 2, 3, 4, 5]) == 15  # custom {dispatch_fn, collect_fn}


@pytest.mark.parametrize("rows", [4, 5])
def test_dp_compute_proto_pads_and_unpads(demo, rows):
    backend, group = demo
    out = group.double(batch(rows))
    assert len(out) == rows
    torch.testing.assert_close(out.batch["y"], 2.0 * torch.arange(rows, dtype=torch.float32))
    # 2 ranks: rows are padded to a multiple of 2 and split in halves; rank 1 gets the second half
    expected_rank = {4: [0, 0, 1, 1], 5: [0, 0, 0, 1, 1]}[rows] if world_size_of(backend) == 2 else [0] * rows
    assert out.batch["rank"].tolist() == expected_rank

    applied = group.apply(lambda x: x * x + 1, batch(rows))  # DP_COMPUTE_PROTO_WITH_FUNC
    torch.testing.assert_close(applied.batch["y"], torch.arange(rows, dtype=torch.float32) ** 2 + 1)


def test_dp_mp_modes_follow_the_workers_rank_info(demo):
    backend, group = demo
    out = group.mp_double(batch(5))  # default layout: dp_size = world_size
    torch.testing.assert_close(out.batch["y"], 2.0 * torch.arange(5, dtype=torch.float32))
    assert out.batch["rank"].tolist() == ([0, 0, 0, 1, 1] if world_size_of(backend) == 2 else [0] * 5)
    if world_size_of(backend) == 1:
        return
    group.set_tp(2)  # now both ranks form one dp group: data replicated, output from tp_rank 0
    out = group.mp_double(batch(5))
    assert out.batch["rank"].tolist() == [0] * 5 and group.last_received() == [5, 5]
    out = group.mp_first(batch(3))  # DISPATCH_FIRST: only tp_rank 0 gets the data
    torch.testing.assert_close(out.batch["y"], torch.tensor([0.0, 2.0, 4.0]))
    assert group.last_received() == [3, None]
    group.set_tp(1)


def test_async_calls_and_future_arguments(demo):
    backend, group = demo
    n = world_size_of(backend)
    future = group.slow_add_rank(1, 0.2)
    assert isinstance(future, WorkerFuture)
    assert future.get() == [1, 2][:n]
    pending = group.double_x_async(batch(3))  # non-blocking DataProto result (x doubled) ...
    out = group.double(pending)  # ... resolved before it is dispatched again (y = 2 * 2x)
    torch.testing.assert_close(out.batch["y"], torch.tensor([0.0, 4.0, 8.0]))

    handles = group.execute_all_async("add_rank", 5)
    if backend == "ray":
        assert all(isinstance(h, ray.ObjectRef) for h in handles.handles)
    assert handles.get() == [5, 6][:n]
    assert group.execute_all_sync("add_rank", [7, 8][:n]) == [7, 9][:n]  # per-rank list is split
    assert group.execute_rank_zero_sync("add_rank", 3) == 3
    assert group.execute_rank_zero("add_rank", 4).get() == 4


def test_torch_distributed_all_reduce(demo):
    backend, group = demo
    n = world_size_of(backend)
    assert group.init_process_group(backend="gloo", timeout_s=60) == ["gloo"] * n
    # sum over ranks of 1.0 * (rank + 1): 1 + 2 = 3 with two workers
    assert group.all_reduce(1.0) == ([3.0, 3.0] if n == 2 else [1.0])
    if backend == "local":
        dist.destroy_process_group()


def test_inconsistent_rank_info_is_reported(make_group):
    group = make_group("local", ClassWithInitArgs(DemoWorker), name_prefix="bad_layout")
    group.set_tp(2)  # one worker cannot be a tp group of 2: dp_size becomes 0
    with pytest.raises(ValueError, match="'bad_layout': inconsistent rank_info"):
        group.mp_double(batch(2))
