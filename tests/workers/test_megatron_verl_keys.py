"""verl's Megatron keys on rlvr's Megatron backend, each with its effect: enable_gradient_checkpointing
and override_transformer_config (megatron-core's activation recompute: the same update),
megatron.seed (the role's random init), megatron.dtype (mixed precision: bf16 compute, close to fp32)."""

from __future__ import annotations

import gc

import pytest
import torch
from model_worker_utils import local_group, make_config, prompt_batch, with_advantages

pytestmark = pytest.mark.megatron
pytest.importorskip("megatron.core")

from rlvr.workers.engine_workers import ActorRolloutRefWorker  # noqa: E402
from rlvr.workers.megatron.local_ranks import shutdown_local_ranks  # noqa: E402
from rlvr.workers.megatron.workers import MegatronActorRolloutRefWorker, MegatronCriticWorker  # noqa: E402

MEGATRON = ("actor_rollout_ref.model.attn_implementation=eager", "actor_rollout_ref.actor.optim.lr=0.001",
            "actor_rollout_ref.actor.strategy=megatron", "critic.strategy=megatron")


@pytest.fixture(autouse=True)
def fresh_ranks():
    yield
    gc.collect()
    shutdown_local_ranks()


def _update(model_dir, *extra) -> tuple[dict, torch.Tensor]:
    rollout = local_group(ActorRolloutRefWorker, make_config(model_dir), "rollout").generate_sequences(prompt_batch())
    rollout.meta_info["temperature"] = 1.0
    mega = local_group(MegatronActorRolloutRefWorker, make_config(model_dir, *MEGATRON, *extra), "actor_rollout_ref")
    old = mega.compute_log_prob(rollout).batch["old_log_probs"]
    mega.update_actor(with_advantages(rollout, [1.0, -0.5, 2.0, -1.0], old - 0.05))
    config = mega._workers[0].actor_module.gpt.config
    weights = mega.get_actor_weights()[0]
    del mega
    gc.collect()
    shutdown_local_ranks()
    return {"recompute": (config.recompute_granularity, config.recompute_method, config.recompute_num_layers)}, \
        torch.cat([w.flatten() for w in weights.values()])


def test_recompute_from_gradient_checkpointing_and_overrides_keeps_the_update(model_dir):
    plain_cfg, plain = _update(model_dir)
    full_cfg, full = _update(model_dir, "actor_rollout_ref.model.enable_gradient_checkpointing=true")
    block_cfg, block = _update(model_dir, "actor_rollout_ref.actor.megatron.override_transformer_config."
                               "recompute_granularity=full", "actor_rollout_ref.actor.megatron."
                               "override_transformer_config.recompute_method=block",
                               "actor_rollout_ref.actor.megatron.override_transformer_config.recompute_num_layers=1")
    assert plain_cfg["recompute"] == (None, None, None)
    assert full_cfg["recompute"] == ("full", "uniform", 1) and block_cfg["recompute"] == ("full", "block", 1)
    assert (full - plain).abs().max() < 1e-6 and (block - plain).abs().max() < 1e-6


def test_megatron_seed_and_mixed_precision(model_dir):
    def value_head(seed: str) -> torch.Tensor:
        critic = local_group(MegatronCriticWorker, make_config(model_dir, *MEGATRON, f"critic.megatron.seed={seed}"))
        head = critic._workers[0].critic_module.value_head.weight.detach().clone()
        del critic
        gc.collect()
        shutdown_local_ranks()
        return head

    assert torch.equal(value_head("3"), value_head("3")) and not torch.equal(value_head("3"), value_head("4"))
    rollout = local_group(ActorRolloutRefWorker, make_config(model_dir), "rollout").generate_sequences(prompt_batch())
    rollout.meta_info["temperature"] = 1.0
    mask = rollout.batch["response_mask"].bool()
    log_probs = []
    for extra in ((), ("actor_rollout_ref.actor.megatron.dtype=bf16",)):
        mega = local_group(MegatronActorRolloutRefWorker, make_config(model_dir, *MEGATRON, *extra), "actor_rollout")
        log_probs.append(mega.compute_log_prob(rollout).batch["old_log_probs"])
        del mega
        gc.collect()
        shutdown_local_ranks()
    diff = (log_probs[0] - log_probs[1])[mask].abs().max()
    assert 1e-4 < diff < 0.2  # bf16 compute: off the fp32 values, but close


def _megatron_saves(monkeypatch, source: str, folder) -> dict[str, torch.Tensor]:
    """megatron-core's own ``dist_checkpointing.save`` of a Megatron policy built from ``source``
    (verl's converter writes the same); returns the policy's HF weights. On CPU its two CUDA calls
    (a stream sync, the device of a status flag) are pointed at the CPU."""
    from megatron.core import dist_checkpointing

    group = local_group(MegatronActorRolloutRefWorker, make_config(source, *MEGATRON), "actor")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args, **kwargs: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    folder.mkdir()
    dist_checkpointing.save(group._workers[0].actor_module.gpt.sharded_state_dict(), str(folder))
    weights = group.get_actor_weights()[0]
    del group
    gc.collect()
    shutdown_local_ranks()
    return weights


def test_use_dist_checkpointing_starts_the_role_from_a_megatron_checkpoint(model_dir, tmp_path, monkeypatch):
    """The actor (and the rollout's replica) start from the checkpoint's weights, not model.path's;
    the reference, whose section does not set the key, from model.path's; the critic's backbone
    from the checkpoint when its section sets it."""
    from transformers import AutoModelForCausalLM

    from rlvr.utils.testing import save_tiny_model
    from rlvr.workers.megatron.weights import gather_hf_weights

    saved = _megatron_saves(monkeypatch, str(save_tiny_model(tmp_path / "other", seed=1)), tmp_path / "ckpt")
    hf = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
    assert not torch.equal(saved["model.norm.weight"], hf["model.norm.weight"]) or \
        not torch.equal(saved["model.embed_tokens.weight"], hf["model.embed_tokens.weight"])
    dist = ("actor_rollout_ref.actor.megatron.use_dist_checkpointing=true",
            f"actor_rollout_ref.actor.megatron.dist_checkpointing_path={tmp_path / 'ckpt'}")
    mega = local_group(MegatronActorRolloutRefWorker, make_config(model_dir, *MEGATRON, *dist), "actor_rollout_ref")
    worker = mega._workers[0]
    actor = mega.get_actor_weights()[0]
    replica = worker._rollout_replica.state_dict()
    ref = dict(gather_hf_weights(worker.ref.module))
    assert all(torch.equal(actor[name], saved[name]) and torch.equal(replica[name], saved[name]) for name in saved)
    assert all(torch.equal(tensor, hf[name]) for name, tensor in ref.items())
    del mega
    gc.collect()
    shutdown_local_ranks()
    critic = local_group(MegatronCriticWorker, make_config(
        model_dir, *MEGATRON, "critic.megatron.use_dist_checkpointing=true",
        f"critic.megatron.dist_checkpointing_path={tmp_path / 'ckpt'}"))
    backbone = dict(gather_hf_weights(critic._workers[0].critic_module, prefix="backbone.", lm_head=False))
    assert backbone and all(torch.equal(tensor, saved["model." + name[len("backbone."):]])
                            for name, tensor in backbone.items())
