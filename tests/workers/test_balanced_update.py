"""trainer.balance_batch leaves the update unchanged (rlvr.trainer.ppo.balance): on 2 gloo ranks (FSDP2),
the same 16 rows in two optimizer steps give the same log-probs, losses, gradient norms and weights
(fp32, 1e-6) in the dispatch order and in the balanced order, whose ranks hold about the same tokens;
balancing over the whole batch instead (rows crossing mini-batches, verl's keep_minibatch=False) changes
the update."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.multiprocessing as mp
from balance_ranks import RANKS, ROWS, dispatch_batch, orders, run_rank

TOL = 1e-6


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("balance")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(run_rank, args=(port, str(out)), nprocs=RANKS, start_method="spawn")
    return [torch.load(out / f"rank{rank}.pt") for rank in range(RANKS)]


def _rows(ranks: list[dict], run: str) -> torch.Tensor:
    """The per-row log-probs of ``run`` (each rank returns its own rows) back in the dispatch order."""
    rows = torch.cat([result[run]["log_probs"] for result in ranks])
    back = torch.empty_like(rows)
    back[torch.tensor(orders()[run])] = rows
    return back


@pytest.mark.slow
def test_the_balanced_order_evens_out_the_ranks_tokens(ranks):
    dispatch = [result["dispatch"]["tokens"] for result in ranks]
    balanced = [result["balanced"]["tokens"] for result in ranks]
    assert sum(dispatch) == sum(balanced)
    assert max(dispatch) / min(dispatch) > 2  # longest rows first: rank 0 holds the long half
    assert max(balanced) / min(balanced) < 1.05


def test_the_balanced_update_equals_the_unbalanced_one(ranks):
    mask = dispatch_batch()["response_mask"].bool()
    assert float((_rows(ranks, "balanced") - _rows(ranks, "dispatch"))[mask].abs().max()) < TOL
    for result in ranks:
        for name in ("actor/pg_loss", "actor/ppo_kl", "actor/pg_clipfrac", "actor/grad_norm"):
            dispatch, balanced = result["dispatch"]["metrics"][name], result["balanced"]["metrics"][name]
            assert len(dispatch) == 2  # two optimizer steps
            assert balanced == pytest.approx(dispatch, rel=TOL, abs=TOL), name
        for name, weight in result["dispatch"]["weights"].items():
            torch.testing.assert_close(result["balanced"]["weights"][name], weight, atol=TOL, rtol=TOL, msg=name)


def test_rows_crossing_mini_batches_change_the_update(ranks):
    """The check above can fail: moving rows between mini-batches moves the weights by far more than 1e-6."""
    assert ROWS // RANKS > 4  # the whole-batch order mixes the 2 mini-batches of each rank
    gaps = [float((result["whole_batch"]["weights"][name] - weight).abs().max())
            for result in ranks for name, weight in result["dispatch"]["weights"].items()]
    assert max(gaps) > 1e-4
