"""One GRPO step of tiny Qwen3-MoE and Mixtral policies through FSDP2 on 2 Ray ranks equals the same
step on 1 local rank (fp32, 1e-5): the rollout's routes replayed (R3), the load-balancing loss in the
actor's loss, the reference; and a Qwen2-MoE critic (shared expert) on 2 ranks equals 1 rank."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from model_worker_utils import local_group, make_config, prompt_batch

from rlvr.trainer.ppo.core_algos import compute_grpo_outcome_advantage
from rlvr.utils.tiny_moe import save_tiny_moe
from rlvr.workers.engine_workers import ActorRolloutRefWorker, CriticWorker
from rlvr.workers.moe.layout import ROUTED_EXPERTS

pytestmark = [pytest.mark.ray, pytest.mark.slow]

TOL = 1e-5
OVERRIDES = ("actor_rollout_ref.actor.optim.lr=0.01", "critic.optim.lr=0.01",
             "actor_rollout_ref.actor.use_rollout_log_probs=false", "actor_rollout_ref.rollout.n=2",
             "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
             "actor_rollout_ref.actor.use_kl_loss=true",
             "actor_rollout_ref.rollout.enable_rollout_routing_replay=true",
             "actor_rollout_ref.actor.fsdp_config.router_replay.mode=R3",
             "actor_rollout_ref.model.override_config.output_router_logits=true",
             "actor_rollout_ref.model.override_config.router_aux_loss_coef=0.05",
             # the same forward on both sides: one rank would share prompts, two do not; that forward's float
             # rounding, which AdamW's first step amplifies on near-zero gradients (weights 1.7e-5 apart here,
             # 2e-7 in float64), is tested against the plain forward in test_moe_shared_prompt.py
             "actor_rollout_ref.actor.share_prompt_forward=false")


def _grpo_batch(out, rewards: list[float]):
    """The rollout's output with GRPO advantages of the given sequence rewards (groups of 2 rows)."""
    mask = out.batch["response_mask"]
    scores = torch.tensor(rewards)[:, None] * (torch.arange(mask.shape[1]) == mask.sum(-1, keepdim=True) - 1)
    index = np.array([str(i // 2) for i in range(len(rewards))], dtype=object)
    advantages, _ = compute_grpo_outcome_advantage(scores.float(), mask, index)
    out.batch["advantages"] = advantages
    return out


@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral"])
def test_one_grpo_step_on_two_ranks_equals_one_rank(arch, ray_groups, tmp_path):
    path = str(save_tiny_moe(tmp_path / arch, arch, seed=0))
    config = make_config(path, *OVERRIDES)
    local = local_group(ActorRolloutRefWorker, config, "actor_rollout_ref")
    sharded = ray_groups(ActorRolloutRefWorker, config, "actor_rollout_ref")
    out = sharded.generate_sequences(prompt_batch(n=2))  # 8 rows, the experts of every token
    assert out.batch[ROUTED_EXPERTS].shape[2:] == (2, 2)
    out.meta_info["temperature"] = 1.0
    mask = out.batch["response_mask"].bool()
    old = sharded.compute_log_prob(out).batch["old_log_probs"]
    assert float((old - out.batch["rollout_log_probs"])[mask].abs().max()) < TOL  # replayed routes: the engine's
    assert float((local.compute_log_prob(out).batch["old_log_probs"] - old)[mask].abs().max()) < TOL
    out.batch["old_log_probs"] = old
    out.batch["ref_log_prob"] = sharded.compute_ref_log_prob(out).batch["ref_log_prob"]
    assert float((local.compute_ref_log_prob(out).batch["ref_log_prob"] - out.batch["ref_log_prob"])[mask]
                 .abs().max()) < TOL
    batch = _grpo_batch(out, [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.5, 0.0])
    one = local.update_actor(batch).meta_info["metrics"]
    two = sharded.update_actor(batch).meta_info["metrics"]
    names = ["actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/moe_aux_loss",
             "actor/moe_load_entropy/layer_0", "actor/moe_load_entropy/layer_1"]
    for name in names:
        assert two[name] == [pytest.approx(v, rel=TOL, abs=TOL) for v in one[name]] * 2, name
    w_one, w_two = local.get_actor_weights()[0], sharded.get_actor_weights()[0]
    assert max(float((w_one[k] - w_two[k]).abs().max()) for k in w_one) < TOL


def test_the_moe_critic_on_two_ranks_equals_one_rank(ray_groups, tmp_path):
    config = make_config(str(save_tiny_moe(tmp_path / "qwen2_moe", "qwen2_moe", seed=0)), *OVERRIDES)
    out = local_group(ActorRolloutRefWorker, config, "rollout").generate_sequences(prompt_batch(n=2))
    mask = out.batch["response_mask"].bool()
    batch = _grpo_batch(out, [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.5, 0.0])
    critic_one, critic_two = local_group(CriticWorker, config), ray_groups(CriticWorker, config)
    values = critic_one.compute_values(out).batch["values"]
    assert float((critic_two.compute_values(out).batch["values"] - values)[mask].abs().max()) < TOL
    out.batch["values"], out.batch["returns"] = values, values + batch.batch["advantages"]
    c_one = critic_one.update_critic(out).meta_info["metrics"]
    c_two = critic_two.update_critic(out).meta_info["metrics"]
    for name in ("critic/vf_loss", "critic/grad_norm"):
        assert c_two[name] == [pytest.approx(c_one[name][0], rel=TOL, abs=TOL)] * 2, name
