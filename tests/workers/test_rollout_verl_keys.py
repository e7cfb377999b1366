"""verl's rollout keys on the HF engine, each with its effect: rollout.seed (the sampling seed of
every worker), rollout.dtype (the HF engine generates from its own copy of the weights in that
dtype, refreshed from the actor), rollout.calculate_log_probs=false (no rollout log-probs)."""

from __future__ import annotations

import torch
from model_worker_utils import local_group, make_config, prompt_batch, with_advantages

from rlvr.workers.engine_workers import ActorRolloutRefWorker


def hybrid(model_dir, *overrides):
    return local_group(ActorRolloutRefWorker, make_config(model_dir, *overrides), "actor_rollout")


def _samples(model_dir, *overrides) -> torch.Tensor:
    return hybrid(model_dir, *overrides).generate_sequences(prompt_batch()).batch["responses"]


def test_rollout_seed_sets_the_sampling_seed(model_dir):
    same = _samples(model_dir, "actor_rollout_ref.rollout.seed=11", "trainer.seed=1")
    assert torch.equal(same, _samples(model_dir, "actor_rollout_ref.rollout.seed=11", "trainer.seed=2"))
    assert not torch.equal(same, _samples(model_dir, "actor_rollout_ref.rollout.seed=12", "trainer.seed=1"))


def test_rollout_dtype_gives_the_hf_engine_its_own_copy_in_that_dtype(model_dir):
    group = hybrid(model_dir, "actor_rollout_ref.rollout.dtype=bfloat16", "actor_rollout_ref.actor.optim.lr=0.05")
    worker = group._workers[0]
    engine_params = dict(worker.rollout.module.named_parameters())
    assert not worker._rollout_shares_actor
    assert {p.dtype for p in engine_params.values()} == {torch.bfloat16}
    assert {p.dtype for p in worker.actor_module.parameters()} == {torch.float32}
    out = group.generate_sequences(prompt_batch())
    assert out.meta_info["rollout_log_probs_exact"] is False  # bf16 log-probs: the actor recomputes them
    old = group.compute_log_prob(out).batch["old_log_probs"]
    group.update_actor(with_advantages(out, [1.0, -1.0, 1.0, -1.0], old))
    group.update_weights()
    for name, param in worker.actor_module.named_parameters():
        assert torch.equal(engine_params[name], param.detach().to(torch.bfloat16)), name


def test_calculate_log_probs_false_returns_no_rollout_log_probs(model_dir):
    out = hybrid(model_dir, "actor_rollout_ref.rollout.calculate_log_probs=false").generate_sequences(prompt_batch())
    assert "rollout_log_probs" not in out.batch.keys() and "responses" in out.batch.keys()
