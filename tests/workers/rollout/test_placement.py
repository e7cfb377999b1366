"""Where in-process engines sit (rlvr.workers.rollout.placement): 2 gloo ranks, one engine between them.
The ranks of an engine see the same rows (all of theirs, in rank order) and the same sampling seed,
and each keeps its own rows of an output; one rank per engine changes nothing."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.multiprocessing as mp
from placement_ranks import run_rank

from rlvr.protocol import DataProto
from rlvr.workers.rollout.placement import SEED_STRIDE, RolloutPlacement


@pytest.mark.slow
def test_ranks_of_one_engine_share_rows_and_seeds_and_keep_their_own(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(run_rank, args=(2, port, str(tmp_path)), nprocs=2, start_method="spawn")
    ranks = [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(2)]
    assert [r["engine"] for r in ranks] == [0, 0]
    assert [r["seed"] for r in ranks] == [7 + SEED_STRIDE] * 2
    assert ranks[0]["gathered"] == ranks[1]["gathered"] == [0, 1, 10, 11, 12]  # rank 0's 2 rows, rank 1's 3
    assert ranks[1]["gathered_uid"] == ["r0-0", "r0-1", "r1-0", "r1-1", "r1-2"]
    assert [r["counts"] for r in ranks] == [[2, 3], [2, 3]]
    for rank, result in enumerate(ranks):  # each keeps its own rows, as this rank computed them
        assert result["own"] == [10 * rank + i for i in range(2 + rank % 2)]
        assert set(result["own_seen_by"]) == {rank}


def test_one_rank_per_engine_is_the_identity():
    placement = RolloutPlacement(1, 3, 4)
    data = DataProto.from_dict(tensors={"x": torch.arange(3)})
    rows, counts = placement.gather(data)
    assert rows is data and counts == [3] and placement.own(rows, counts) is rows
    assert (placement.engine, placement.num_engines, placement.engine_seed(7)) == (3, 4, 7 + 4 * SEED_STRIDE)
    assert placement.engine_seed(7, rollout_seed=100) == 103  # verl's rollout.seed: + the engine
    with pytest.raises(ValueError, match="3 rollout workers do not split into engines of tensor_model_parallel_size=2"):
        RolloutPlacement(2, 0, 3)
