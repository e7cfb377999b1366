"""What each of the 2 processes of the SPMD group test runs (a module of its own, so that spawned
processes can import it): the same driver code on both, a ``DemoWorker`` group over them."""

from __future__ import annotations

import os

import torch
from sc_workers import DemoWorker

from rlvr.protocol import DataProto
from rlvr.single_controller import ClassWithInitArgs
from rlvr.single_controller.spmd import SPMDWorkerGroup
from rlvr.utils.errors import WorkerError


def run_rank(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    group = SPMDWorkerGroup(ClassWithInitArgs(DemoWorker, 3.0), call_timeout_s=60)
    data = DataProto.from_dict(tensors={"x": torch.arange(6.0)})
    results = {
        "lead": group.is_lead, "from_lead": group.from_lead(f"decided by {rank}"),
        "add_rank": group.add_rank(10), "square": group.square([1, 2]), "whoami": group.whoami("t"),
        "double": group.double(data).batch["y"], "rows_by": group.double(data).batch["rank"],
    }
    try:
        group.fail_on(1)
    except WorkerError as err:
        results["error"] = str(err)
    group.barrier()
    torch.save(results, f"{out_dir}/rank{rank}.pt")
