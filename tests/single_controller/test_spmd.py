"""The SPMD worker group (torchrun's processes, each running the driver's code) over 2 gloo
processes: every dispatch mode gives both processes the group's result, the lead's decisions
reach both, and a rank's exception reaches both as a ``WorkerError`` naming it."""

from __future__ import annotations

import torch
import torch.multiprocessing as mp
from spmd_ranks import run_rank

from rlvr.single_controller.base.worker import free_port


def test_both_processes_see_the_group_results(tmp_path):
    mp.start_processes(run_rank, args=(free_port(), str(tmp_path)), nprocs=2, start_method="spawn")
    zero, one = (torch.load(tmp_path / f"rank{rank}.pt", weights_only=False) for rank in range(2))
    assert (zero["lead"], one["lead"]) == (True, False)
    for result in (zero, one):
        assert result["from_lead"] == "decided by 0"
        assert result["add_rank"] == [10, 11] and result["square"] == [1, 4] and result["whoami"] == ("t", 0)
        assert torch.equal(result["double"], 6.0 * torch.arange(6.0))
        assert result["rows_by"].tolist() == [0, 0, 0, 1, 1, 1]
        assert "method 'fail_on', rank 1 failed" in result["error"] and "deliberate failure on rank 1" in result["error"]
