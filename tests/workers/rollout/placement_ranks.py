"""What each of 2 gloo ranks runs in the placement test (a module of its own for spawned processes):
one engine of 2 ranks; every rank gathers its engine's rows, marks them with its rank, keeps its own."""

from __future__ import annotations

import os

import numpy as np
import torch
import torch.distributed as dist

from rlvr.protocol import DataProto
from rlvr.workers.rollout.placement import RolloutPlacement


def run_rank(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    placement = RolloutPlacement(2, rank, world)
    rows = 2 + rank % 2  # the ranks of an engine may hold different row counts
    mine = DataProto.from_dict(tensors={"x": torch.arange(rows) + 10 * rank},
                               non_tensors={"uid": np.array([f"r{rank}-{i}" for i in range(rows)], dtype=object)},
                               meta_info={"validate": False})
    gathered, counts = placement.gather(mine)
    output = gathered.select(batch_keys=["x"])
    output.batch["seen_by"] = torch.full((len(gathered),), rank)
    own = placement.own(output, counts)
    torch.save({"engine": placement.engine, "seed": placement.engine_seed(7), "counts": counts,
                "gathered": gathered.batch["x"].tolist(), "gathered_uid": gathered.non_tensor_batch["uid"].tolist(),
                "own": own.batch["x"].tolist(), "own_seen_by": own.batch["seen_by"].tolist()},
               os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()
