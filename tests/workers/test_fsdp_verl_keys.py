"""verl's FSDP and model keys, each with its effect: fsdp_config.model_dtype (the parameters' dtype),
dtype (mixed precision: autocast on one rank, FSDP2's policy on several), offload_policy and
forward_prefetch (FSDP2's), seed (the random parts of a role), full_determinism, nccl_timeout,
model.override_config and exclude_modules, loss_scale_factor, data_loader_seed."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
from model_worker_utils import make_config, prompt_batch

from rlvr.workers.actor.dp_actor import DataParallelPPOActor
from torch.distributed.device_mesh import init_device_mesh

from rlvr.workers.fsdp import compute_dtype, fsdp_options, fsdp_wrap
from rlvr.workers.models import build_causal_lm, build_critic
from rlvr.workers.worker_utils import seed_role, use_full_determinism


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def one_rank_group():
    """A gloo process group of one rank in this process (FSDP2 shards over a mesh of one)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_fsdp_options_reach_fully_shard(model_dir, one_rank_group):
    """With sharding (here a mesh of one rank, as each rank of a group sees it), offload_policy gives
    every unit FSDP2's CPUOffloadPolicy, forward_prefetch chains each decoder layer to the next, and
    dtype=bf16 over fp32 parameters is FSDP2's mixed-precision policy (bf16 compute, fp32 reduce):
    the logits move off the fp32 ones but stay close."""
    cfg = make_config(model_dir, "actor_rollout_ref.actor.fsdp_config.offload_policy=true",
                      "actor_rollout_ref.actor.fsdp_config.forward_prefetch=true",
                      "actor_rollout_ref.actor.fsdp_config.dtype=bf16").actor_rollout_ref
    reference = build_causal_lm(cfg.model, trainable=True)
    module = build_causal_lm(cfg.model, trainable=True)
    fsdp_wrap(module, init_device_mesh("cpu", (1,)), **fsdp_options(cfg.actor.fsdp_config, module))
    layers = list(module.model.layers)
    states = [layer._get_fsdp_state() for layer in layers]
    assert all(type(s._fsdp_param_group.offload_policy).__name__ == "CPUOffloadPolicy" for s in states)
    assert states[0]._states_to_forward_prefetch == [states[1]] and states[1]._states_to_forward_prefetch == []
    assert states[0]._fsdp_param_group.mp_policy.param_dtype == torch.bfloat16
    ids = torch.tensor([[5, 9, 13, 2, 7]])
    with torch.no_grad():
        exact, mixed = reference(input_ids=ids).logits, module(input_ids=ids).logits
    assert mixed.dtype == torch.bfloat16 and 1e-4 < (mixed.float() - exact).abs().max() < 0.1


def test_model_dtype_and_mixed_precision_on_one_rank(model_dir):
    cfg = make_config(model_dir, "actor_rollout_ref.actor.fsdp_config.model_dtype=bf16").actor_rollout_ref
    assert next(build_causal_lm(cfg.model, True, cfg.actor.fsdp_config.model_dtype).parameters()).dtype == torch.bfloat16
    module = build_causal_lm(cfg.model, trainable=False)
    assert compute_dtype(cfg.actor.fsdp_config, module) is None  # verl's fp32 / rlvr's None: no mixed precision
    mixed = make_config(model_dir, "actor_rollout_ref.actor.fsdp_config.dtype=bfloat16").actor_rollout_ref
    assert compute_dtype(mixed.actor.fsdp_config, module) == torch.bfloat16
    data = prompt_batch(temperature=1.0)
    data.batch["responses"] = data.batch["input_ids"][:, -2:]
    kwargs = {"mini_batch_size": 4, "log_prob_micro_batch_size": 4, "world_size": 1, "device": "cpu"}
    exact, _ = DataParallelPPOActor(cfg.actor, module, None, **kwargs).compute_log_prob(data)
    autocast, _ = DataParallelPPOActor(cfg.actor, module, None, compute_dtype=torch.bfloat16,
                                       **kwargs).compute_log_prob(data)
    assert autocast.dtype == torch.float32 and 1e-4 < (autocast - exact).abs().max() < 0.2


def test_a_role_seed_decides_its_random_parts(model_dir):
    def value_head(seed: str) -> torch.Tensor:
        critic = make_config(model_dir, f"critic.fsdp_config.seed={seed}").critic
        seed_role(critic.fsdp_config)
        return build_critic(critic.model, str(model_dir)).value_head.weight.detach().clone()

    assert torch.equal(value_head("3"), value_head("3"))
    assert not torch.equal(value_head("3"), value_head("4"))


def test_full_determinism_turns_on_deterministic_kernels():
    before = torch.are_deterministic_algorithms_enabled()
    try:
        use_full_determinism()
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(before)


def test_process_group_timeout_follows_nccl_timeout(model_dir):
    from rlvr.workers.engine_workers import ActorRolloutRefWorker, CriticWorker

    default = make_config(model_dir)
    assert ActorRolloutRefWorker(default, "actor")._process_group_timeout() == 300  # trainer.call_timeout_s
    verl = make_config(model_dir, "actor_rollout_ref.nccl_timeout=600", "critic.nccl_timeout=120")
    assert ActorRolloutRefWorker(verl, "actor")._process_group_timeout() == 600
    assert CriticWorker(verl)._process_group_timeout() == 120


def test_override_config_and_lora_exclude_modules(model_dir):
    model = make_config(model_dir, "actor_rollout_ref.model.override_config.attention_dropout=0.25",
                        "actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.exclude_modules=[k_proj]",
                        "actor_rollout_ref.model.target_modules=[q_proj,k_proj]").actor_rollout_ref.model
    lm = build_causal_lm(model, trainable=True)
    assert lm.config.attention_dropout == 0.25
    adapted = {name.split(".")[-4] for name, _ in lm.named_parameters() if "lora_A" in name}
    assert adapted == {"q_proj"}


def test_loss_scale_factor_divides_the_sequence_sums(model_dir):
    """seq-mean-token-sum-norm divides each sequence's token sum by loss_scale_factor (else by the
    response length): the loss scales by length / factor."""
    data = prompt_batch(temperature=1.0)
    responses = data.batch["input_ids"][:, -2:]
    data.batch["responses"] = responses
    mask = torch.ones(4, 2)
    micro = {**{k: data.batch[k] for k in ("input_ids", "attention_mask", "position_ids")}, "responses": responses,
             "response_mask": mask, "old_log_probs": torch.zeros(4, 2), "advantages": torch.ones(4, 2)}
    losses = []
    for factor in ("null", "8"):
        cfg = make_config(model_dir, "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm",
                          f"actor_rollout_ref.actor.loss_scale_factor={factor}").actor_rollout_ref
        actor = DataParallelPPOActor(cfg.actor, build_causal_lm(cfg.model, trainable=False), None,
                                     mini_batch_size=4, log_prob_micro_batch_size=4, world_size=1, device="cpu")
        losses.append(actor._micro_loss(micro, 1.0)[0].item())
    assert losses[1] == pytest.approx(losses[0] * 2 / 8, rel=1e-5)


def test_data_loader_seed_fixes_the_mini_batch_shuffle(model_dir):
    def generator_draws(seed: str) -> list[int]:
        cfg = make_config(model_dir, "actor_rollout_ref.actor.shuffle=true",
                          f"actor_rollout_ref.actor.data_loader_seed={seed}").actor_rollout_ref
        actor = DataParallelPPOActor(cfg.actor, torch.nn.Linear(1, 1), None, mini_batch_size=4,
                                     log_prob_micro_batch_size=4, world_size=1, device="cpu")
        return torch.randperm(16, generator=actor.shuffle_generator).tolist()

    assert generator_draws("42") == generator_draws("42") == torch.randperm(
        16, generator=torch.Generator().manual_seed(42)).tolist()
    assert generator_draws("42") != generator_draws("43")
