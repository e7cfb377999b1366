"""What each gloo rank runs in the context-parallel gradient test (a module of its own, so that spawned
processes can import it): the tiny Llama as a Megatron policy with the given tensor x context parallel
layout, log-probs and entropies of a fixed batch, a loss of both, its backward and the finished
gradients (summed over the context-parallel ranks), saved to disk."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from packed_batches import random_batch
from transformers import AutoModelForCausalLM

from rlvr.workers.megatron.actor import policy_log_probs
from rlvr.workers.megatron.grads import clip_grad_norm
from rlvr.workers.megatron.parallel import init_megatron_parallel
from rlvr.workers.megatron.weights import policy_from_hf

ROWS = 4


def batch() -> dict[str, torch.Tensor]:
    """Left-padded prompts of 1..13 and right-padded responses of 1..12 tokens: 25 columns, not a
    multiple of the 2 x cp chunks, so the split pads the sequences."""
    return random_batch(rows=ROWS, prompt_len=13, response_len=12, seed=5)


def run_rank(rank: int, world: int, tp: int, cp: int, port: int, model_dir: str, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    parallel = init_megatron_parallel(tp, 1, "cpu", seed=7, timeout_s=300, cp=cp)
    policy = policy_from_hf(AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager"), parallel)
    data = batch()
    stats = policy_log_probs(policy, data, temperature=0.8, with_entropy=True)
    log_probs, entropy = stats["log_probs"], stats["entropy"]
    weights = torch.randn(log_probs.shape, generator=torch.Generator().manual_seed(3)) * data["response_mask"]
    loss = (log_probs * weights).sum() + 0.1 * (entropy * weights).sum()
    loss.backward()
    norm = clip_grad_norm(policy, 1e9)  # finishes the gradients; nothing is clipped
    torch.save({"tp_rank": parallel.tp_rank, "cp_rank": parallel.cp_rank, "log_probs": log_probs.detach(),
                "entropy": entropy.detach(), "loss": float(loss), "norm": norm,
                "grads": {name: p.grad.clone() for name, p in policy.named_parameters()}},
               os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()
