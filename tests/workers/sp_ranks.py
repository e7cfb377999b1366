"""What each of the 2 gloo ranks runs in the sequence-parallel tests (a module of its own, so that
spawned processes can import it): FSDP2 over both ranks with Ulysses SP=2, the results saved to disk."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from packed_batches import actor_config, make_actor, make_critic, random_batch, tiny_model

from rlvr.protocol import DataProto
from rlvr.workers.ulysses import (
    SequenceParallel,
    heads_to_sequence,
    sequence_parallel_group,
    sequence_to_heads,
    shared_generator,
)

ROWS = 8


def actor_step(actor, batch: dict) -> dict:
    """Old log-probs, entropies, one update; the results and the weights after the step."""
    data = DataProto.from_dict(tensors=batch, meta_info={"temperature": 0.8})
    log_probs, entropy = actor.compute_log_prob(data, calculate_entropy=True)
    data.batch["old_log_probs"] = log_probs - 0.1 * batch["response_mask"]
    metrics = actor.update_policy(data)
    return {"log_probs": log_probs, "entropy": entropy, "metrics": metrics}


def critic_step(critic, batch: dict) -> dict:
    data = DataProto.from_dict(tensors=batch)
    values = critic.compute_values(data)
    data.batch["values"] = values
    data.batch["returns"] = values + batch["advantages"]
    return {"values": values, "metrics": critic.update_critic(data)}


def _all_to_all_round_trip(sp: SequenceParallel) -> dict:
    """heads_to_sequence then sequence_to_heads is the identity, and so is its gradient."""
    gen = torch.Generator().manual_seed(sp.rank)
    x = torch.randn(1, 4, 3, 2, generator=gen, requires_grad=True)  # [b, heads, my tokens, d]
    full = heads_to_sequence(x, sp)  # [b, 2 heads, 6 tokens, d]
    back = sequence_to_heads(full.transpose(1, 2), sp).transpose(1, 2)
    (back * torch.arange(24.0).view(1, 4, 3, 2)).sum().backward()
    return {"x": x.detach(), "full": full.detach(), "back": back.detach(), "grad": x.grad}


def run_rank(rank: int, port: int, out_dir: str) -> None:
    """Rank ``rank`` of 2: its half of every batch, the models sharded over both, SP=2."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    sp = sequence_parallel_group(2, 2)
    own = slice(rank * ROWS // 2, (rank + 1) * ROWS // 2)
    batch = {key: value[own] for key, value in random_batch(rows=ROWS, seed=7).items()}
    results = {"round_trip": _all_to_all_round_trip(sp)}
    torch.manual_seed(100 + rank)  # the global RNGs differ; the shared generator agrees
    results["shuffle"] = torch.randperm(16, generator=shared_generator(sp))
    for arch, kv_heads in (("llama", 2), ("qwen2", 1)):  # qwen2 with 1 key/value head: repeated for SP=2
        config = actor_config("use_dynamic_bsz=true", "ppo_max_token_len_per_gpu=40")
        actor = make_actor(tiny_model(arch, num_key_value_heads=kv_heads, checkpointing=arch == "llama"), 2,
                           packed=True, sp_size=2, lr=0.5, mini_batch_size=ROWS // 4, config=config,
                           log_prob_use_dynamic_bsz=True, log_prob_max_token_len=32)
        results[arch] = actor_step(actor, batch)
        results[arch]["weights"] = {n: p.full_tensor() for n, p in actor.module.named_parameters()}
    critic = make_critic("llama", 2, True, 2, 0.5, ROWS // 4, "use_dynamic_bsz=true", "ppo_max_token_len_per_gpu=40")
    results["critic"] = critic_step(critic, batch)
    results["critic"]["weights"] = {n: p.full_tensor() for n, p in critic.module.named_parameters()}
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()
