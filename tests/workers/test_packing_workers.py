"""The role workers with packing and token budgets (local backend, tiny Llama): the same log-probs,
reference log-probs, values and updates as the padded workers, LoRA included."""

from __future__ import annotations

import pytest
import torch
from model_worker_utils import PROMPTS, make_config, with_advantages

from rlvr.protocol import DataProto
from rlvr.single_controller import ClassWithInitArgs, LocalResourcePool, LocalWorkerGroup
from rlvr.utils.testing import tiny_tokenizer
from rlvr.utils.torch_functional import compute_position_ids
from rlvr.workers.engine_workers import ActorRolloutRefWorker, CriticWorker

PACKED = ("actor_rollout_ref.model.use_remove_padding=true", "actor_rollout_ref.actor.use_dynamic_bsz=true",
          "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24")
COMMON = ("actor_rollout_ref.actor.optim.lr=0.01", "actor_rollout_ref.actor.use_rollout_log_probs=false",
          "actor_rollout_ref.rollout.response_length=12", "actor_rollout_ref.actor.use_kl_loss=true")


def prompt_batch() -> DataProto:
    """Left-padded prompts (the rollout's contract; packing refuses padding between real tokens)."""
    tokenizer = tiny_tokenizer()
    tokenizer.padding_side = "left"
    enc = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    mask = enc["attention_mask"]
    return DataProto.from_dict(
        tensors={"input_ids": enc["input_ids"], "attention_mask": mask, "position_ids": compute_position_ids(mask)},
        non_tensors={"uid": [str(i) for i in range(len(PROMPTS))]})


def group(cls, config, *args):
    made = LocalWorkerGroup(LocalResourcePool(), ClassWithInitArgs(cls, config, *args))
    made.init_model()
    return made


@pytest.mark.parametrize("lora", ["0", "4"])
def test_packed_hybrid_worker_equals_padded(model_dir, lora):
    overrides = (*COMMON, f"actor_rollout_ref.model.lora_rank={lora}")
    padded = group(ActorRolloutRefWorker, make_config(model_dir, *overrides), "actor_rollout_ref")
    packed = group(ActorRolloutRefWorker, make_config(model_dir, *overrides, *PACKED), "actor_rollout_ref")
    assert packed._workers[0].actor.log_prob_use_dynamic_bsz  # the rollout's pass follows the actor's budget
    out = padded.generate_sequences(prompt_batch())
    assert torch.equal(packed.generate_sequences(prompt_batch()).batch["responses"], out.batch["responses"])
    out.meta_info["temperature"] = 1.0
    mask = out.batch["response_mask"].bool()
    old = padded.compute_log_prob(out).batch["old_log_probs"]
    assert (packed.compute_log_prob(out).batch["old_log_probs"] - old)[mask].abs().max() < 1e-5
    ref = padded.compute_ref_log_prob(out).batch["ref_log_prob"]
    assert (packed.compute_ref_log_prob(out).batch["ref_log_prob"] - ref)[mask].abs().max() < 1e-5
    batch = with_advantages(out, [1.0, -0.5, 2.0, -1.0], old - 0.05)
    batch.batch["ref_log_prob"] = ref
    one = padded.update_actor(batch).meta_info["metrics"]
    two = packed.update_actor(batch).meta_info["metrics"]
    for name in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm"):
        assert two[name] == [pytest.approx(one[name][0], rel=1e-5, abs=1e-7)], name
    after = padded.compute_log_prob(out).batch["old_log_probs"]
    assert (packed.compute_log_prob(out).batch["old_log_probs"] - after)[mask].abs().max() < 1e-5


def test_packed_critic_worker_equals_padded(model_dir):
    critic = ("critic.optim.lr=0.01", "actor_rollout_ref.rollout.response_length=12")
    padded = group(CriticWorker, make_config(model_dir, *critic))
    packed = group(CriticWorker, make_config(model_dir, *critic, "critic.model.use_remove_padding=true",
                                             "critic.use_dynamic_bsz=true", "critic.ppo_max_token_len_per_gpu=30"))
    out = group(ActorRolloutRefWorker, make_config(model_dir, *critic), "rollout").generate_sequences(prompt_batch())
    values = padded.compute_values(out).batch["values"]
    assert (packed.compute_values(out).batch["values"] - values).abs().max() < 1e-5  # zero outside the mask
    out.batch["values"], out.batch["returns"] = values, values + 1.0
    one = padded.update_critic(out).meta_info["metrics"]
    two = packed.update_critic(out).meta_info["metrics"]
    for name in ("critic/vf_loss", "critic/grad_norm"):
        assert two[name] == [pytest.approx(one[name][0], rel=1e-5)], name
