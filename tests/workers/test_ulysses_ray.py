"""The role workers on 2 Ray ranks with Ulysses SP=2 and packing (FSDP2 over gloo) against the same
workers on 1 local rank without sequence parallelism: the config keys reach the workers, and the
log-probs, reference log-probs, values and updates agree."""

from __future__ import annotations

import pytest
from model_worker_utils import local_group, make_config, with_advantages
from test_packing_workers import prompt_batch

from rlvr.workers.engine_workers import ActorRolloutRefWorker, CriticWorker

pytestmark = [pytest.mark.ray, pytest.mark.slow]  # Ray start-up and 4 workers: minutes on 2 shared cores

COMMON = ("actor_rollout_ref.actor.optim.lr=0.01", "critic.optim.lr=0.01",
          "actor_rollout_ref.actor.use_rollout_log_probs=false", "actor_rollout_ref.rollout.response_length=10",
          "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.model.use_remove_padding=true",
          "critic.model.use_remove_padding=true")
SP2 = ("actor_rollout_ref.actor.ulysses_sequence_parallel_size=2", "critic.ulysses_sequence_parallel_size=2")


def test_sequence_parallel_workers_on_two_ray_ranks_match_one_rank(model_dir, ray_groups):
    local = local_group(ActorRolloutRefWorker, make_config(model_dir, *COMMON), "actor_rollout_ref")
    sharded = ray_groups(ActorRolloutRefWorker, make_config(model_dir, *COMMON, *SP2), "actor_rollout_ref")
    critic_local = local_group(CriticWorker, make_config(model_dir, *COMMON))
    critic_sharded = ray_groups(CriticWorker, make_config(model_dir, *COMMON, *SP2))
    out = local.generate_sequences(prompt_batch())
    out.meta_info["temperature"] = 1.0
    mask = out.batch["response_mask"].bool()
    old = local.compute_log_prob(out).batch["old_log_probs"]
    assert (sharded.compute_log_prob(out).batch["old_log_probs"] - old)[mask].abs().max() < 1e-5
    ref = local.compute_ref_log_prob(out).batch["ref_log_prob"]
    assert (sharded.compute_ref_log_prob(out).batch["ref_log_prob"] - ref)[mask].abs().max() < 1e-5
    batch = with_advantages(out, [1.0, -0.5, 2.0, -1.0], old - 0.05)
    batch.batch["ref_log_prob"] = ref
    one = local.update_actor(batch).meta_info["metrics"]
    two = sharded.update_actor(batch).meta_info["metrics"]
    for name in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm"):
        assert two[name] == [pytest.approx(one[name][0], rel=1e-5, abs=1e-7)] * 2, name
    values = critic_local.compute_values(out).batch["values"]
    assert (critic_sharded.compute_values(out).batch["values"] - values).abs().max() < 1e-5
    out.batch["values"], out.batch["returns"] = values, values + 1.0
    one = critic_local.update_critic(out).meta_info["metrics"]
    two = critic_sharded.update_critic(out).meta_info["metrics"]
    assert two["critic/grad_norm"] == [pytest.approx(one["critic/grad_norm"][0], rel=1e-5)] * 2
