"""Helpers of the merger tests (a module of its own, so that the worker processes of the 2-rank test
can import its functions): a training batch, one PPO step on a worker group, and the logits of the
model in training."""

from __future__ import annotations

import torch

from rlvr.protocol import DataProto

ROWS, PROMPT, RESPONSE = 4, 3, 5


def token_batch(seed: int = 0, rows: int = ROWS, vocab: int = 260) -> DataProto:
    """Random prompt and response ids ``[rows, PROMPT + RESPONSE]`` (no padding), every response
    token in the loss; ``meta_info["temperature"] = 1``."""
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(4, vocab, (rows, PROMPT), generator=gen)
    responses = torch.randint(4, vocab, (rows, RESPONSE), generator=gen)
    ids = torch.cat([prompts, responses], dim=1)
    return DataProto.from_dict(tensors={
        "input_ids": ids, "attention_mask": torch.ones_like(ids),
        "position_ids": torch.arange(ids.shape[1]).expand(rows, -1).clone(), "responses": responses,
        "response_mask": torch.ones(rows, RESPONSE, dtype=torch.long)}, meta_info={"temperature": 1.0})


def ppo_step(group, seed: int = 0, vocab: int = 260) -> None:
    """One ``update_actor`` on a random batch with advantages of both signs (the weights change)."""
    data = token_batch(seed, vocab=vocab)
    data.batch["old_log_probs"] = group.compute_log_prob(data).batch["old_log_probs"]
    data.batch["advantages"] = torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None] * data.batch["response_mask"]
    group.update_actor(data)


def actor_logits(worker, data: DataProto) -> DataProto:
    """``logits [b, T, V]`` of the worker's actor module (sharded or not) on its rows (run through
    ``execute_with_func_generator``)."""
    module = worker.actor_module
    module.eval()
    with torch.no_grad():
        logits = module(input_ids=data.batch["input_ids"], attention_mask=data.batch["attention_mask"],
                        position_ids=data.batch["position_ids"]).logits
    return DataProto.from_dict(tensors={"logits": logits.float()})


def model_logits(model, data: DataProto, chunks: int = 1) -> torch.Tensor:
    """Logits of a plain model on ``data``, ``chunks`` rows blocks at a time (as ranks split the rows),
    on one thread (as the workers run)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            parts = [model(input_ids=part.batch["input_ids"], attention_mask=part.batch["attention_mask"],
                           position_ids=part.batch["position_ids"]).logits.float() for part in data.chunk(chunks)]
    finally:
        torch.set_num_threads(threads)
    return torch.cat(parts)
