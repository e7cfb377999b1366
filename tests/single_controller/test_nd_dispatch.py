"""verl's nd dispatch (``make_nd_compute_dataproto_dispatch_fn``): workers register their dp rank and
whether their output is kept for a mesh; DataProto and TensorDict arguments are cut by dp rank and the
kept outputs concatenated. On a stand-in group of 4 ranks (2 dp x 2 tp) and on the local backend."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from rlvr.protocol import DataProto
from rlvr.single_controller import ClassWithInitArgs, LocalResourcePool, LocalWorkerGroup
from rlvr.single_controller.base.decorator import make_nd_compute_dataproto_dispatch_fn, register
from rlvr.single_controller.base.worker import Worker
from rlvr.utils import tensordict_utils as tu
from rlvr.utils.errors import WorkerError


class Group:
    """4 ranks: dp rank r // 2; the tp-rank-0 worker of each pair is collected."""

    world_size = 4

    def __init__(self) -> None:
        self._dispatch_info: dict = {}
        self._collect_info: dict = {}
        self.queries = 0

    def _query_dispatch_info(self, mesh_name: str) -> list[int]:
        self.queries += 1
        return [0, 0, 1, 1]

    def _query_collect_info(self, mesh_name: str) -> list[bool]:
        return [True, False, True, False]


def test_arguments_are_cut_by_dp_rank_and_the_collecting_ranks_concatenated():
    fns, group = make_nd_compute_dataproto_dispatch_fn("train"), Group()
    data = DataProto.from_dict(tensors={"x": torch.arange(4)})
    td = tu.get_tensordict({"y": torch.arange(4) * 10, "tags": ["a", "b", "c", "d"]}, {"temp": 0.5})
    (parts, td_parts), kwargs = fns["dispatch_fn"](group, data, td, scale=2)
    assert [p.batch["x"].tolist() for p in parts] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert [p["y"].tolist() for p in td_parts] == [[0, 10], [0, 10], [20, 30], [20, 30]]
    assert tu.get(td_parts[2], "tags") == ["c", "d"] and tu.get(td_parts[3], "temp") == 0.5
    assert kwargs == {"scale": [2, 2, 2, 2]}
    fns["dispatch_fn"](group, data)
    assert group.queries == 1  # asked once per group and mesh
    outputs = [DataProto.from_dict(tensors={"x": torch.tensor([10 * r, 10 * r + 1])}) for r in range(4)]
    assert fns["collect_fn"](group, outputs).batch["x"].tolist() == [0, 1, 20, 21]  # ranks 0 and 2
    merged = fns["collect_fn"](group, td_parts)
    assert merged["y"].tolist() == [0, 10, 20, 30] and tu.get(merged, "tags") == ["a", "b", "c", "d"]
    assert fns["collect_fn"](group, ["r0", "r1", "r2", "r3"]) == ["r0", "r2"]


class MeshWorker(Worker):
    def __init__(self) -> None:
        super().__init__()
        self._register_dispatch_collect_info(mesh_name="train", dp_rank=self.rank, is_collect=True)

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="train"), blocking=False)
    def double(self, data: TensorDict) -> TensorDict:
        data = tu.contiguous(data)
        data["out"] = data["x"] * 2
        return data


def test_a_worker_registers_its_mesh_once_and_the_local_group_dispatches_by_it():
    group = LocalWorkerGroup(LocalResourcePool([1]), ClassWithInitArgs(MeshWorker), name_prefix="nd_mesh")
    try:
        out = group.double(TensorDict({"x": torch.arange(3.0)}, batch_size=[3])).get()
        assert out["out"].tolist() == [0.0, 2.0, 4.0]
        assert group._query_dispatch_info("train") == [0] and group._query_collect_info("train") == [True]
        with pytest.raises(WorkerError, match="other is not registered in MeshWorker"):
            group._query_dispatch_info("other")
    finally:
        group.shutdown()
    worker = MeshWorker()
    with pytest.raises(ValueError, match="train has been registered"):
        worker._register_dispatch_collect_info("train", 0, True)


def test_a_worker_takes_the_layout_of_other_roles():
    ref, actor, both = MeshWorker.__new__(MeshWorker), MeshWorker.__new__(MeshWorker), MeshWorker.__new__(MeshWorker)
    for worker in (ref, actor, both):
        Worker.__init__(worker)
    ref._register_dispatch_collect_info("ref", dp_rank=0, is_collect=True)
    actor._register_dispatch_collect_info("actor", dp_rank=3, is_collect=False)
    both.set_dispatch_collect("ref", **ref.get_dispatch_collect())
    both.set_dispatch_collect("actor", **actor.get_dispatch_collect())
    assert both.get_dispatch_collect() == {"dispatch_dp_rank": {"ref": 0, "actor": 3},
                                           "collect_dp_rank": {"ref": True, "actor": False}}
    with pytest.raises(AssertionError, match="actor is already registered"):
        both.set_dispatch_collect("actor", **actor.get_dispatch_collect())
