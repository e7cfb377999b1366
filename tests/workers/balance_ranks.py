"""What each of the 2 gloo ranks runs in the balanced-update test (a module of its own, so that spawned
processes can import it): the same 16 rows trained in the dispatch order, in the order of
``trainer.balance_batch`` and in an order balanced over the whole batch (verl's ``keep_minibatch=False``),
each from the same weights, the results saved to disk."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from packed_batches import make_actor, random_batch, tiny_model

from rlvr.protocol import DataProto
from rlvr.trainer.ppo.balance import UpdateLayout, balanced_order

ROWS, RANKS, MINI = 16, 2, 4  # each rank: 8 rows in 2 mini-batches of 4 (2 optimizer steps), micro-batches of 2
LAYOUT = UpdateLayout(RANKS, MINI)


def dispatch_batch() -> dict[str, torch.Tensor]:
    """16 rows of 2..40 tokens, longest first: the dispatch gives rank 0 the long half."""
    batch = random_batch(rows=ROWS, seed=11)
    order = torch.argsort(batch["attention_mask"].sum(-1), descending=True, stable=True)
    return {key: value[order] for key, value in batch.items()}


def orders() -> dict[str, list[int]]:
    lens = dispatch_batch()["attention_mask"].sum(-1).tolist()
    return {"dispatch": list(range(ROWS)), "balanced": balanced_order(lens, [LAYOUT])[0],
            "whole_batch": balanced_order(lens, [UpdateLayout(RANKS, ROWS // RANKS)])[0]}


def _train(rank: int, batch: dict[str, torch.Tensor]) -> dict:
    own = slice(rank * ROWS // RANKS, (rank + 1) * ROWS // RANKS)
    data = DataProto.from_dict(tensors={key: value[own] for key, value in batch.items()},
                               meta_info={"temperature": 0.8})
    actor = make_actor(tiny_model("llama"), RANKS, lr=0.5, mini_batch_size=MINI)
    log_probs, _ = actor.compute_log_prob(data, calculate_entropy=False)
    data.batch["old_log_probs"] = log_probs - 0.1 * data.batch["response_mask"]
    metrics = actor.update_policy(data)
    return {"log_probs": log_probs, "metrics": metrics, "tokens": int(data.batch["attention_mask"].sum()),
            "weights": {n: p.full_tensor().detach() for n, p in actor.module.named_parameters()}}


def run_rank(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=RANKS)
    torch.set_num_threads(1)
    batch = dispatch_batch()
    results = {name: _train(rank, {key: value[torch.tensor(order)] for key, value in batch.items()})
               for name, order in orders().items()}
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()
