"""What each gloo rank runs in the Megatron LoRA tests (a module of its own, so that spawned processes
can import it): the tiny Llama as a Megatron policy with LoRA adapters (B drawn non-zero, so the
adapters matter) in the given tensor-parallel layout; log-probs of a fixed batch, the PPO loss, its
backward, the finished gradients of the adapters and the adapters themselves (gathered to full
tensors), the merged HF weights of ``gather_hf_weights`` and which parameters one step of the
actor's optimizer changed, saved to disk."""

from __future__ import annotations

import os
from dataclasses import replace

import torch
import torch.distributed as dist
from packed_batches import random_batch
from transformers import AutoModelForCausalLM

from rlvr.trainer.config.schema import OptimConfig
from rlvr.trainer.ppo.policy_loss import compute_policy_loss
from rlvr.workers.megatron.actor import policy_log_probs
from rlvr.workers.megatron.grads import clip_grad_norm
from rlvr.workers.megatron.lora import apply_lora, full_adapters
from rlvr.workers.megatron.lora_spec import LoraSpec
from rlvr.workers.megatron.parallel import init_megatron_parallel
from rlvr.workers.megatron.weights import gather_hf_weights, policy_from_hf
from rlvr.workers.optimizer import build_optimizer

TEMPERATURE = 0.8


def batch() -> dict[str, torch.Tensor]:
    return random_batch(rows=4, prompt_len=7, response_len=6, seed=5)


def old_log_probs(log_probs: torch.Tensor) -> torch.Tensor:
    """The behaviour policy's log-probs of the loss: ``log_probs`` moved by a fixed small noise."""
    return log_probs.detach() + 0.05 * torch.randn(log_probs.shape, generator=torch.Generator().manual_seed(9))


def ppo_loss(log_probs: torch.Tensor, old: torch.Tensor, data: dict) -> torch.Tensor:
    return compute_policy_loss(old, log_probs, data["advantages"], data["response_mask"], cliprange=0.2)[0]


def spec(kind: str) -> LoraSpec:
    targets = (("linear_q", "linear_v", "linear_proj", "linear_fc1_up", "linear_fc2") if kind == "canonical_lora"
               else ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"))
    return LoraSpec(rank=4, alpha=8.0, kind=kind, targets=targets, a_init="xavier", b_init="normal", seed=11)


def run_rank(rank: int, world: int, tp: int, port: int, model_dir: str, out_dir: str, kind: str,
             dropout_position: str | None = None) -> None:
    """``dropout_position``: with dropout 0.3 there, in training mode, the default generator seeded
    alike on every rank (as :func:`~rlvr.workers.megatron.parallel.broadcast_rng_state` leaves it)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    parallel = init_megatron_parallel(tp, 1, "cpu", seed=7, timeout_s=300)
    policy = policy_from_hf(AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager"), parallel)
    lora = spec(kind) if dropout_position is None else replace(spec(kind), dropout=0.3,
                                                                dropout_position=dropout_position)
    apply_lora(policy, lora)
    policy.train()
    torch.manual_seed(123)
    trainable = sorted(name for name, p in policy.named_parameters() if p.requires_grad)
    data = batch()
    log_probs = policy_log_probs(policy, data, temperature=TEMPERATURE, with_entropy=False)["log_probs"]
    old = old_log_probs(log_probs)
    loss = ppo_loss(log_probs, old, data)
    loss.backward()
    clip_grad_norm(policy, 1e9)  # finishes the gradients; nothing is clipped
    full = {"adapters": full_adapters(policy, parallel.tp_group),
            "grads": full_adapters(policy, parallel.tp_group, grads=True),
            "merged": {name: t.clone() for name, t in gather_hf_weights(policy)}}
    before = {name: p.detach().clone() for name, p in policy.named_parameters()}
    build_optimizer(policy, OptimConfig(lr=0.01)).step()  # the actor's optimizer: one step
    changed = sorted(name for name, p in policy.named_parameters() if not torch.equal(p, before[name]))
    torch.save({**full, "changed": changed, "tp_rank": parallel.tp_rank, "log_probs": log_probs.detach(), "old": old,
                "loss": loss.item(), "trainable": trainable,
                "with_grad": sorted(n for n, p in policy.named_parameters() if p.grad is not None)},
               os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()
