"""Megatron workers on 4 Ray ranks, tensor parallel 2 x data parallel 2 (gloo), against the FSDP2
workers on 1 local rank: the batch methods split over the data-parallel groups, the gradients are
averaged over them, every rank's rollout replica follows the weights."""

from __future__ import annotations

import pytest
import torch
from model_worker_utils import local_group, make_config, prompt_batch, with_advantages

pytestmark = [pytest.mark.megatron, pytest.mark.ray]
pytest.importorskip("megatron.core")

from rlvr.protocol import DataProto  # noqa: E402
from rlvr.workers.engine_workers import ActorRolloutRefWorker, CriticWorker  # noqa: E402
from rlvr.workers.megatron.workers import MegatronActorRolloutRefWorker, MegatronCriticWorker  # noqa: E402

COMMON = ("actor_rollout_ref.model.attn_implementation=eager", "actor_rollout_ref.actor.optim.lr=0.001",
          "critic.optim.lr=0.01", "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
          "critic.ppo_mini_batch_size=4")
MEGATRON = ("actor_rollout_ref.actor.strategy=megatron", "critic.strategy=megatron",
            "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2", "trainer.n_gpus_per_node=4")


RAY_RANKS = 4


def test_tensor_and_data_parallel_on_ray_match_fsdp(model_dir, ray_groups):
    fsdp_config = make_config(model_dir, *COMMON)
    fsdp = local_group(ActorRolloutRefWorker, fsdp_config, "actor_rollout")
    mega = ray_groups(MegatronActorRolloutRefWorker, make_config(model_dir, *COMMON, *MEGATRON), "actor_rollout")
    assert [(i.dp_rank, i.tp_rank) for i in mega.rank_infos()] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    prompts = prompt_batch().repeat(2, interleave=True)  # 8 rows: 4 per data-parallel group
    out = fsdp.generate_sequences(prompts)
    out.meta_info["temperature"] = 1.0
    mask = out.batch["response_mask"].bool()
    old = fsdp.compute_log_prob(out).batch["old_log_probs"]
    assert (mega.compute_log_prob(out).batch["old_log_probs"] - old)[mask].abs().max() < 1e-5

    out.batch["response_mask"][0, 3:] = 0  # the data-parallel groups hold different token counts
    batch = with_advantages(out, [1.0, -0.5, 2.0, -1.0, 0.5, 1.5, -2.0, 0.0], old - 0.05)
    one = fsdp.update_actor(batch).meta_info["metrics"]
    two = mega.update_actor(batch).meta_info["metrics"]
    for name in ("actor/pg_loss", "actor/ppo_kl", "actor/grad_norm"):
        assert two[name] == [pytest.approx(one[name][0], rel=1e-5, abs=1e-6)] * 2, name  # one per dp group
    w_one, w_two = fsdp.get_actor_weights()[0], mega.get_actor_weights()[0]
    assert max(float((w_one[k] - w_two[k]).abs().max()) for k in w_one) < 1e-5

    greedy = prompt_batch(validate=True).repeat(2, interleave=True)  # every rank generates its share
    assert torch.equal(fsdp.generate_sequences(greedy).batch["responses"], mega.generate_sequences(greedy).batch["responses"])


def test_critic_on_ray_matches_fsdp(model_dir, ray_groups):
    config = make_config(model_dir, *COMMON)
    out = local_group(ActorRolloutRefWorker, config, "rollout").generate_sequences(prompt_batch().repeat(2))
    mask = out.batch["response_mask"].bool()
    fsdp = local_group(CriticWorker, config)
    mega = ray_groups(MegatronCriticWorker, make_config(model_dir, *COMMON, *MEGATRON))
    values = fsdp.compute_values(out).batch["values"]
    assert (mega.compute_values(out).batch["values"] - values)[mask].abs().max() < 1e-5
    returns = torch.linspace(-1, 1, 8)[:, None] * out.batch["response_mask"]
    batch = DataProto.from_dict(tensors={**{k: out.batch[k] for k in out.batch.keys()}, "values": values,
                                         "returns": returns})
    one, two = fsdp.update_critic(batch).meta_info["metrics"], mega.update_critic(batch).meta_info["metrics"]
    assert two["critic/grad_norm"] == [pytest.approx(one["critic/grad_norm"][0], rel=1e-5)] * 2
    assert (mega.compute_values(out).batch["values"] - fsdp.compute_values(out).batch["values"])[mask].abs().max() < 1e-5
