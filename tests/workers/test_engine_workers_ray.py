"""Role workers on 2 Ray ranks (FSDP2 over gloo) against the same workers on 1 local rank."""

from __future__ import annotations

import pytest
import torch
from model_worker_utils import local_group, make_config, prompt_batch, with_advantages
from transformers import AutoModelForCausalLM

from rlvr.protocol import DataProto

from rlvr.workers.engine_workers import ActorRolloutRefWorker, CriticWorker

pytestmark = [pytest.mark.ray, pytest.mark.slow]

OVERRIDES = ("actor_rollout_ref.actor.optim.lr=0.001", "critic.optim.lr=0.01",
             "actor_rollout_ref.actor.use_rollout_log_probs=false")


def test_fsdp_two_ranks_match_one_rank_and_the_rollout_follows(model_dir, ray_groups, tmp_path):
    config = make_config(model_dir, *OVERRIDES)
    local = local_group(ActorRolloutRefWorker, config, "actor_rollout_ref")
    sharded = ray_groups(ActorRolloutRefWorker, config, "actor_rollout_ref")

    # the 2-rank rollout (unsharded replica) scores like the 2-rank FSDP actor
    out = sharded.generate_sequences(prompt_batch())
    out.meta_info["temperature"] = 1.0
    mask = out.batch["response_mask"].bool()
    old = sharded.compute_log_prob(out).batch["old_log_probs"]
    assert (old - out.batch["rollout_log_probs"])[mask].abs().max() < 1e-5
    assert (local.compute_log_prob(out).batch["old_log_probs"] - old)[mask].abs().max() < 1e-5
    ref = sharded.compute_ref_log_prob(out).batch["ref_log_prob"]  # separately sharded frozen copy
    assert (ref - old)[mask].abs().max() < 1e-5

    # the same global batch gives the same loss, gradient norm and new weights
    out.batch["response_mask"][0, 3:] = 0  # ranks hold different token counts
    batch = with_advantages(out, [1.0, -0.5, 2.0, -1.0], old - 0.05)
    one = local.update_actor(batch).meta_info["metrics"]
    two = sharded.update_actor(batch).meta_info["metrics"]
    for name in ("actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/grad_norm"):
        assert two[name] == [pytest.approx(one[name][0], rel=1e-5, abs=1e-7)] * 2, name
    w_one, w_two = local.get_actor_weights()[0], sharded.get_actor_weights()[0]
    assert w_one.keys() == w_two.keys()
    assert max((w_one[k] - w_two[k]).abs().max().item() for k in w_one) < 1e-6

    # checkpoints move between layouts: 2 ranks -> 1 rank and 1 rank -> 2 ranks (optimizer included)
    sharded.save_checkpoint(str(tmp_path / "two"))
    local.save_checkpoint(str(tmp_path / "one"))
    reloaded = local_group(ActorRolloutRefWorker, config, "actor_rollout_ref")
    reloaded.load_checkpoint(str(tmp_path / "two"))
    assert all(torch.equal(reloaded.get_actor_weights()[0][k], w_two[k]) for k in w_two)
    sharded.load_checkpoint(str(tmp_path / "one"))
    again_one = local.update_actor(batch).meta_info["metrics"]
    again_two = sharded.update_actor(batch).meta_info["metrics"]
    assert again_two["actor/grad_norm"] == [pytest.approx(again_one["actor/grad_norm"][0], rel=1e-5)] * 2
    assert again_two["actor/lr"] == again_one["actor/lr"] * 2
    w_one, w_two = local.get_actor_weights()[0], sharded.get_actor_weights()[0]
    assert max((w_one[k] - w_two[k]).abs().max().item() for k in w_one) < 1e-6

    # after the update the replica is refreshed: greedy output and sampling log-probs follow
    greedy_one = local.generate_sequences(prompt_batch(validate=True)).batch["responses"]
    greedy_two = sharded.generate_sequences(prompt_batch(validate=True)).batch["responses"]
    assert torch.equal(greedy_one, greedy_two)
    fresh = sharded.generate_sequences(prompt_batch())
    fresh.meta_info["temperature"] = 1.0
    fresh_mask = fresh.batch["response_mask"].bool()
    rescored = sharded.compute_log_prob(fresh).batch["old_log_probs"]
    assert (rescored - fresh.batch["rollout_log_probs"])[fresh_mask].abs().max() < 1e-5

    # the export from 2 ranks is a plain Hugging Face folder with the gathered weights
    sharded.export_hf(str(tmp_path / "hf"))
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").state_dict()
    assert all(torch.equal(exported[k], w_two[k]) for k in w_two)


def test_fsdp_critic_two_ranks_match_one_rank(model_dir, ray_groups):
    config = make_config(model_dir, *OVERRIDES)
    rollout = local_group(ActorRolloutRefWorker, config, "rollout")
    out = rollout.generate_sequences(prompt_batch())
    local = local_group(CriticWorker, config)
    sharded = ray_groups(CriticWorker, config)
    values = local.compute_values(out).batch["values"]
    assert torch.allclose(sharded.compute_values(out).batch["values"], values, atol=1e-6)
    returns = torch.tensor([1.0, -1.0, 0.5, 2.0])[:, None] * out.batch["response_mask"]
    batch = DataProto.from_dict(tensors={**{k: out.batch[k] for k in out.batch.keys()}, "values": values,
                                         "returns": returns})
    one = local.update_critic(batch).meta_info["metrics"]
    two = sharded.update_critic(batch).meta_info["metrics"]
    assert two["critic/vf_loss"] == [pytest.approx(one["critic/vf_loss"][0], rel=1e-5)] * 2
    assert two["critic/grad_norm"] == [pytest.approx(one["critic/grad_norm"][0], rel=1e-5)] * 2
    assert torch.allclose(sharded.compute_values(out).batch["values"], local.compute_values(out).batch["values"],
                          atol=1e-5)


def test_fsdp_lora_two_ranks_reference_is_the_base_model(model_dir, ray_groups):
    config = make_config(model_dir, "actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.actor.optim.lr=0.05")
    sharded = ray_groups(ActorRolloutRefWorker, config, "actor_rollout_ref")
    base = local_group(ActorRolloutRefWorker, make_config(model_dir), "ref")
    out = sharded.generate_sequences(prompt_batch())
    mask = out.batch["response_mask"].bool()
    old = sharded.compute_log_prob(out).batch["old_log_probs"]
    sharded.update_actor(with_advantages(out, [1.0, -1.0, 1.0, -1.0], old))
    new = sharded.compute_log_prob(out).batch["old_log_probs"]
    ref = sharded.compute_ref_log_prob(out).batch["ref_log_prob"]
    assert (ref - base.compute_ref_log_prob(out).batch["ref_log_prob"])[mask].abs().max() < 1e-5
    assert (new - ref)[mask].abs().max() > 1e-3
