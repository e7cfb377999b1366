"""A mixture-of-experts policy in the role workers on one rank (local backend): the HF rollout records
the experts of every token, the actor replays them (R3) or its own (R2), and the reference and the
critic run the MoE model."""

from __future__ import annotations

import pytest
import torch
from model_worker_utils import local_group, make_config, prompt_batch, with_advantages

from rlvr.utils.model import load_causal_lm
from rlvr.utils.tiny_moe import save_tiny_moe
from rlvr.workers.engine_workers import ActorRolloutRefWorker, CriticWorker
from rlvr.workers.moe.layout import ROUTED_EXPERTS
from rlvr.workers.moe.routers import router_tap

R3 = ("actor_rollout_ref.rollout.enable_rollout_routing_replay=true",
      "actor_rollout_ref.actor.fsdp_config.router_replay.mode=R3",
      "actor_rollout_ref.actor.use_rollout_log_probs=false")


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory) -> str:
    return str(save_tiny_moe(tmp_path_factory.mktemp("moe") / "qwen2_moe", "qwen2_moe", seed=0))


def _last_real(mask: torch.Tensor) -> torch.Tensor:
    """``[B, S]`` bool: each row's last real token."""
    columns = torch.arange(mask.shape[1])
    last = torch.where(mask.bool(), columns, -1).amax(-1)
    return columns[None] == last[:, None]


def test_the_rollout_records_every_fed_token_and_the_actor_replays_them(moe_dir):
    group = local_group(ActorRolloutRefWorker, make_config(moe_dir, *R3), "actor_rollout_ref")
    out = group.generate_sequences(prompt_batch(n=2))  # each prompt twice: prefilled once, routes copied
    routes, mask = out.batch[ROUTED_EXPERTS], out.batch["attention_mask"].bool()
    assert routes.shape == (*mask.shape, 2, 2) and routes.dtype == torch.int16
    known = (routes >= 0).all(-1).all(-1)
    assert not bool(known[~mask].any())
    assert bool(known[mask & ~_last_real(mask)].all())  # only a row's last sampled token may be unknown
    # the routes are those of a plain forward over the finished sequences (fp32: the same choices)
    model = load_causal_lm(moe_dir)
    tap = router_tap(model)
    tap.arm()
    with torch.no_grad():
        model(input_ids=out.batch["input_ids"], attention_mask=out.batch["attention_mask"],
              position_ids=out.batch["position_ids"])
    plain = tap.routes().view(*mask.shape, 2, 2)
    assert torch.equal(plain[known].to(torch.int16), routes[known])
    # the actor replays them (R3): its log-probs are the engine's
    out.meta_info["temperature"] = 1.0
    old = group.compute_log_prob(out).batch["old_log_probs"]
    response = out.batch["response_mask"].bool()
    assert float((old - out.batch["rollout_log_probs"])[response].abs().max()) < 1e-5
    ref = group.compute_ref_log_prob(out).batch["ref_log_prob"]
    assert float((ref - old)[response].abs().max()) < 1e-5
    metrics = group.update_actor(with_advantages(out, [1.0, -1.0] * 4, old)).meta_info["metrics"]
    assert metrics["actor/moe_aux_loss"][0] > 0 and 0 < metrics["actor/moe_load_entropy/layer_1"][0] <= 2.08


def test_r2_returns_the_actors_own_routes(moe_dir):
    group = local_group(ActorRolloutRefWorker,
                        make_config(moe_dir, "actor_rollout_ref.actor.fsdp_config.router_replay.mode=R2"),
                        "actor_rollout_ref")
    out = group.generate_sequences(prompt_batch())
    assert ROUTED_EXPERTS not in out.batch.keys()
    computed = group.compute_log_prob(out)  # R2: never reuses the rollout's log-probs, records the routes
    assert computed.meta_info["metrics"]["actor/reused_rollout_log_probs"] == [0.0]
    routes, mask = computed.batch[ROUTED_EXPERTS], out.batch["attention_mask"].bool()
    assert bool((routes[mask] >= 0).all()) and bool((routes[~mask] == -1).all())
    out.batch[ROUTED_EXPERTS] = routes
    group.update_actor(with_advantages(out, [1.0, -1.0, 1.0, -1.0], computed.batch["old_log_probs"]))


def test_a_dense_model_refuses_routing_replay(model_dir):
    with pytest.raises(Exception, match="has no router rlvr knows"):
        local_group(ActorRolloutRefWorker, make_config(model_dir, *R3), "actor_rollout_ref")


def test_the_critic_runs_the_moe_backbone(moe_dir):
    config = make_config(moe_dir, "critic.optim.lr=0.01")
    out = local_group(ActorRolloutRefWorker, config, "rollout").generate_sequences(prompt_batch())
    critic = local_group(CriticWorker, config)
    values = critic.compute_values(out).batch["values"]
    out.batch["values"] = values
    out.batch["returns"] = values + 1.0
    out.batch["advantages"] = torch.ones_like(values)
    metrics = critic.update_critic(out).meta_info["metrics"]
    assert metrics["critic/vf_loss"][0] == pytest.approx(0.5, rel=1e-5)  # returns - values = 1: 0.5 * 1^2
    assert not torch.equal(critic.compute_values(out).batch["values"], values)
