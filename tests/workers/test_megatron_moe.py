"""Megatron mixture-of-experts (Qwen3-MoE, Qwen2-MoE with its shared expert, Mixtral) on the local
backend against the FSDP2 workers on the same batch, fp32: log-probs, reference, one PPO update (loss,
gradient norm, weights after the step), with the experts split over expert-parallel ranks (megatron's
allgather dispatcher over gloo), composed with pipeline stages and expert tensor parallelism; the
critic; checkpoints per expert coordinate; the layouts that cannot run are refused with the reason."""

from __future__ import annotations

import gc

import pytest
import torch
from model_worker_utils import local_group, make_config, prompt_batch, with_advantages
from transformers import AutoModelForCausalLM

pytestmark = pytest.mark.megatron
pytest.importorskip("megatron.core")

from rlvr.protocol import DataProto  # noqa: E402
from rlvr.utils.errors import WorkerError  # noqa: E402
from rlvr.utils.tiny_moe import save_tiny_moe  # noqa: E402
from rlvr.workers.engine_workers import ActorRolloutRefWorker, CriticWorker  # noqa: E402
from rlvr.workers.megatron.local_ranks import shutdown_local_ranks  # noqa: E402
from rlvr.workers.megatron.workers import MegatronActorRolloutRefWorker, MegatronCriticWorker  # noqa: E402

TOL = 1e-5
COMMON = ("actor_rollout_ref.model.attn_implementation=eager", "actor_rollout_ref.actor.optim.lr=0.001",
          "critic.optim.lr=0.01", "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_coef=0.1")
METRICS = ("actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/kl_loss", "actor/grad_norm")


@pytest.fixture(autouse=True)
def fresh_ranks():
    yield
    gc.collect()
    shutdown_local_ranks()


def _layout(ep: int = 1, pp: int = 1, etp: int | None = None, tp: int = 1) -> tuple[str, ...]:
    mega = "actor_rollout_ref.actor.megatron"
    out = ("actor_rollout_ref.actor.strategy=megatron", "critic.strategy=megatron",
           f"{mega}.expert_model_parallel_size={ep}", f"{mega}.pipeline_model_parallel_size={pp}",
           f"{mega}.tensor_model_parallel_size={tp}")
    return out + ((f"{mega}.expert_tensor_parallel_size={etp}",) if etp else ())


def _step(group, out: DataProto, old: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict, dict]:
    """Log-probs, reference log-probs, one update's metrics and the weights after it."""
    log_probs = group.compute_log_prob(out).batch["old_log_probs"]
    ref = group.compute_ref_log_prob(out).batch["ref_log_prob"]
    batch = with_advantages(out, [1.0, -0.5, 2.0, -1.0], old - 0.05)
    batch.batch["ref_log_prob"] = ref
    metrics = group.update_actor(batch).meta_info["metrics"]
    return log_probs, ref, metrics, group.get_actor_weights()[0]


def _assert_same(one: tuple, two: tuple, mask: torch.Tensor) -> None:
    assert float((one[0] - two[0])[mask].abs().max()) < TOL
    assert float((one[1] - two[1])[mask].abs().max()) < TOL
    for name in METRICS:
        assert two[2][name] == [pytest.approx(one[2][name][0], rel=TOL, abs=1e-6)], name
    assert one[3].keys() == two[3].keys()
    assert max(float((one[3][k] - two[3][k]).abs().max()) for k in one[3]) < TOL


@pytest.mark.parametrize(("arch", "ep", "pp", "etp"), [
    ("qwen3_moe", 2, 1, None), ("qwen2_moe", 2, 1, None), ("mixtral", 2, 1, None),
    ("qwen3_moe", 2, 2, None), ("qwen3_moe", 1, 1, 2),
])
def test_megatron_moe_matches_fsdp(arch, ep, pp, etp, tmp_path):
    path = str(save_tiny_moe(tmp_path / arch, arch, seed=0))
    fsdp = local_group(ActorRolloutRefWorker, make_config(path, *COMMON), "actor_rollout_ref")
    out = fsdp.generate_sequences(prompt_batch())
    out.meta_info["temperature"] = 1.0
    mask = out.batch["response_mask"].bool()
    old = fsdp.compute_log_prob(out).batch["old_log_probs"]
    reference = _step(fsdp, out, old)
    mega = local_group(MegatronActorRolloutRefWorker, make_config(path, *COMMON, *_layout(ep, pp, etp)),
                       "actor_rollout_ref")
    _assert_same(reference, _step(mega, out, old), mask)
    # the rollout's HF replica follows the gathered experts: the same greedy responses
    greedy = prompt_batch(validate=True)
    assert torch.equal(fsdp.generate_sequences(greedy).batch["responses"], mega.generate_sequences(greedy).batch["responses"])


def test_expert_parallel_equals_one_expert_rank_and_checkpoints_per_expert_rank(tmp_path):
    path = str(save_tiny_moe(tmp_path / "mixtral", "mixtral", seed=1))
    out = local_group(ActorRolloutRefWorker, make_config(path, *COMMON), "rollout").generate_sequences(prompt_batch())
    out.meta_info["temperature"] = 1.0
    mask = out.batch["response_mask"].bool()
    results = {}
    for ep in (1, 2):
        mega = local_group(MegatronActorRolloutRefWorker, make_config(path, *COMMON, *_layout(ep)), "actor_rollout_ref")
        old = mega.compute_log_prob(out).batch["old_log_probs"]
        results[ep] = _step(mega, out, old)
        if ep == 2:
            mega.save_checkpoint(str(tmp_path / "ckpt"))
            saved = mega.get_actor_weights()[0]
            moved = _step(mega, out, old)
            mega.load_checkpoint(str(tmp_path / "ckpt"))
            assert _step(mega, out, old)[2] == moved[2]  # weights, optimizer and schedule restored
            mega.export_hf(str(tmp_path / "hf"))
        del mega
        gc.collect()
        shutdown_local_ranks()
    _assert_same(results[1], results[2], mask)
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("megatron_*.pt")) == [
        "megatron_tp0_pp0_ep0_etp0.pt", "megatron_tp0_pp0_ep1_etp0.pt"]
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").state_dict()
    assert set(saved) <= set(exported) and max(float((exported[k] - moved[3][k]).abs().max()) for k in saved) < TOL


def test_megatron_moe_critic_matches_fsdp(tmp_path):
    path = str(save_tiny_moe(tmp_path / "qwen2_moe", "qwen2_moe", seed=0))
    config = make_config(path, *COMMON)
    out = local_group(ActorRolloutRefWorker, config, "rollout").generate_sequences(prompt_batch())
    mask = out.batch["response_mask"].bool()
    fsdp, mega = local_group(CriticWorker, config), local_group(MegatronCriticWorker, make_config(path, *COMMON, *_layout(2)))
    values = fsdp.compute_values(out).batch["values"]
    assert float((mega.compute_values(out).batch["values"] - values)[mask].abs().max()) < TOL
    returns = torch.tensor([1.0, -1.0, 0.5, 2.0])[:, None] * out.batch["response_mask"]
    batch = DataProto.from_dict(tensors={**{k: out.batch[k] for k in out.batch.keys()}, "values": values,
                                         "returns": returns})
    one, two = fsdp.update_critic(batch).meta_info["metrics"], mega.update_critic(batch).meta_info["metrics"]
    for name in ("critic/vf_loss", "critic/grad_norm"):
        assert two[name] == [pytest.approx(one[name][0], rel=TOL, abs=1e-6)], name


def test_layouts_that_cannot_run_are_refused(tmp_path, model_dir):
    moe = str(save_tiny_moe(tmp_path / "moe", "qwen3_moe"))
    with pytest.raises(WorkerError, match="tensor_model_parallel_size=2 with MoE layers: megatron-core trains MoE"):
        local_group(MegatronActorRolloutRefWorker, make_config(moe, *COMMON, *_layout(tp=2)), "actor_rollout_ref")
    gc.collect()
    shutdown_local_ranks()
    with pytest.raises(WorkerError, match="expert_model_parallel_size=2 for a model without experts"):
        local_group(MegatronActorRolloutRefWorker, make_config(model_dir, *COMMON, *_layout(ep=2)), "actor_rollout_ref")


def test_context_parallelism_with_an_moe_model_is_refused(tmp_path):
    from transformers import AutoConfig

    from rlvr.workers.megatron.model import check_supported

    config = AutoConfig.from_pretrained(save_tiny_moe(tmp_path / "moe", "qwen3_moe"))
    check_supported(config, 1.0, cp=1)
    with pytest.raises(ValueError, match="context_parallel_size=2 with a mixture-of-experts model"):
        check_supported(config, 1.0, cp=2)


@pytest.mark.parametrize(("arch", "ep", "mode"), [("qwen3_moe", 1, "R3"), ("mixtral", 2, "R2")])
def test_megatron_routing_replay_and_load_balancing_loss_match_fsdp(arch, ep, mode, tmp_path):
    """The Megatron actor replays the rollout's routes (R3) or records its own in compute_log_prob and
    replays them in the update (R2), adds the load-balancing loss and reports the MoE metrics like FSDP2."""
    path = str(save_tiny_moe(tmp_path / arch, arch, seed=0))
    moe = ("actor_rollout_ref.model.override_config.output_router_logits=true",
           "actor_rollout_ref.model.override_config.router_aux_loss_coef=0.05",
           *(("actor_rollout_ref.rollout.enable_rollout_routing_replay=true",) if mode == "R3" else ()))
    fsdp = local_group(ActorRolloutRefWorker, make_config(
        path, *COMMON, *moe, f"actor_rollout_ref.actor.fsdp_config.router_replay.mode={mode}"), "actor_rollout_ref")
    mega = local_group(MegatronActorRolloutRefWorker, make_config(
        path, *COMMON, *moe, *_layout(ep), f"actor_rollout_ref.actor.megatron.router_replay.mode={mode}"),
        "actor_rollout_ref")
    out = fsdp.generate_sequences(prompt_batch())
    out.meta_info["temperature"] = 1.0
    mask = out.batch["response_mask"].bool()
    one, two = fsdp.compute_log_prob(out).batch, mega.compute_log_prob(out).batch
    assert float((one["old_log_probs"] - two["old_log_probs"])[mask].abs().max()) < TOL
    if mode == "R2":  # the recorded routes: the same experts of every real token, -1 on padding
        real = out.batch["attention_mask"].bool()
        assert torch.equal(one["routed_experts"].sort(-1).values[real], two["routed_experts"].sort(-1).values[real])
        assert bool((two["routed_experts"][~real] == -1).all())
        out.batch["routed_experts"] = one["routed_experts"]
    batch = with_advantages(out, [1.0, -0.5, 2.0, -1.0], one["old_log_probs"] - 0.05)
    batch.batch["ref_log_prob"] = one["old_log_probs"]
    m_one, m_two = fsdp.update_actor(batch).meta_info["metrics"], mega.update_actor(batch).meta_info["metrics"]
    for name in ("actor/pg_loss", "actor/grad_norm", "actor/moe_aux_loss", "actor/moe_load_entropy/layer_0",
                 "actor/moe_load_entropy/layer_1"):
        assert m_two[name] == [pytest.approx(m_one[name][0], rel=TOL, abs=1e-6)], name
    w_one, w_two = fsdp.get_actor_weights()[0], mega.get_actor_weights()[0]
    assert max(float((w_one[k] - w_two[k]).abs().max()) for k in w_one) < TOL
