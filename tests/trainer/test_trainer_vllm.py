"""The trainer with the vLLM engine (tiny model, local backend): weights synced in place every step
as their own stage, the actor recomputes the old log-probs and the mismatch metrics show the gap,
and a stale engine is refused. Needs vLLM (``make setup-vllm``; ``make test-vllm``)."""

from __future__ import annotations

import pytest
from trainer_helpers import tiny_config

from rlvr.trainer.main_ppo import run_ppo
from rlvr.trainer.tracking import read_metrics
from rlvr.utils.errors import StaleRolloutError
from rlvr.utils.testing import save_tiny_model

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    # head size 64 (vLLM's CPU attention kernels do not take the default tiny model's 8)
    return save_tiny_model(tmp_path_factory.mktemp("vllm_tiny") / "model", hidden_size=128, num_attention_heads=2,
                           num_key_value_heads=1, intermediate_size=256)


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_grpo_with_the_vllm_engine(model_dir, tiny_data, tmp_path, lora_rank):
    """Full weights, and LoRA (the engine gets the adapters merged into the base weights: the actor's
    recomputed log-probs agree with the engine's only if it generated with the merged policy)."""
    cfg = tiny_config(model_dir, tiny_data, tmp_path / "run", **{
        "actor_rollout_ref.rollout.name": "vllm", "actor_rollout_ref.rollout.kv_cache_memory_bytes": 64 << 20,
        "trainer.total_training_steps": 2, "algorithm.rollout_correction.rollout_is": "token",
        "actor_rollout_ref.model.lora_rank": lora_rank, "actor_rollout_ref.actor.optim.lr": 0.05})
    trainer = run_ppo(cfg)
    assert trainer.global_steps == 2
    steps = [row for row in read_metrics(tmp_path / "run" / "metrics.jsonl") if "timing_s/step" in row]
    for row in steps:
        assert row["actor/reused_rollout_log_probs"] == 0.0  # vLLM's log-probs are recomputed by the actor
        assert 0.0 <= row["training/rollout_log_probs_diff_max"] < 1e-3  # fp32: kernels differ, barely
        assert row["timing_s/update_weights"] > 0.0
        assert row["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=1e-3)


def test_a_stale_vllm_engine_is_refused(model_dir, tiny_data, tmp_path, monkeypatch):
    from rlvr.workers.rollout import VLLMRollout

    real_update = VLLMRollout.update_weights

    def stale_update(self, weights, version):
        if version == 0:
            real_update(self, weights, version)

    monkeypatch.setattr(VLLMRollout, "update_weights", stale_update)
    cfg = tiny_config(model_dir, tiny_data, tmp_path / "run", **{
        "actor_rollout_ref.rollout.name": "vllm", "actor_rollout_ref.rollout.kv_cache_memory_bytes": 64 << 20,
        "trainer.total_training_steps": 2})
    with pytest.raises(StaleRolloutError, match="weights version 0, but the actor is at version 1"):
        run_ppo(cfg)


def test_one_step_with_the_vllm_engine_apart_from_the_actor(model_dir, tiny_data, tmp_path):
    """The vLLM engine in the rollout's own process (local backend: a child process), one batch
    ahead: its samples are one version old from the second step on, the actor's update gives the
    proximal log-probs (one optimizer step per batch) and the decoupled-PPO correction weighs them."""
    cfg = tiny_config(model_dir, tiny_data, tmp_path / "run", **{
        "actor_rollout_ref.rollout.name": "vllm", "actor_rollout_ref.rollout.kv_cache_memory_bytes": 64 << 20,
        "actor_rollout_ref.hybrid_engine": False, "async_training.mode": "one_step",
        "trainer.total_training_steps": 3, "trainer.val_before_train": False})
    trainer = run_ppo(cfg)
    steps = [row for row in trainer.metrics_history if "timing_s/step" in row]
    assert [row["async/staleness_max"] for row in steps] == [0.0, 1.0, 1.0]
    assert [row["async/tokens_lag_1"] for row in steps] == [0.0, 1.0, 1.0]
    assert all(row["actor/prox_from_update"] == 1.0 and "timing_s/old_log_prob" not in row for row in steps)
    assert all(0.5 < row["rollout_corr/rollout_is_mean"] <= 2.0 and row["training/rollout_log_probs_diff_max"] > 0
               for row in steps)  # bf16 vLLM against the fp32 actor: never exactly equal


APART = {"actor_rollout_ref.hybrid_engine": False, "rollout.n_gpus_per_node": 2, "trainer.n_gpus_per_node": 1,
          "async_training.mode": "one_step"}


@pytest.mark.ray
@pytest.mark.parametrize(("tp", "layout"), [(1, {}), (2, {}), (1, APART)], ids=["dp2", "tp2", "apart_dp2"])
def test_grpo_with_vllm_on_two_ray_workers(model_dir, tiny_data, tmp_path, tp, layout):
    """2 Ray workers (FSDP2 over gloo): an in-process engine on each (data parallel), one engine between
    them (tensor parallel 2), or an engine on each of 2 rollout workers apart from a 1-worker actor (one
    batch ahead). Every step's samples come from the weights pushed last, on every engine (a stale engine
    would stop the run naming it), and their log-probs are within fp32 kernel noise of the actor's."""
    import ray

    from rlvr.single_controller import init_ray

    init_ray(num_cpus=2)
    try:
        cfg = tiny_config(model_dir, tiny_data, tmp_path / "run", **{
            "actor_rollout_ref.rollout.name": "vllm", "actor_rollout_ref.rollout.kv_cache_memory_bytes": 64 << 20,
            "actor_rollout_ref.rollout.tensor_model_parallel_size": tp, "trainer.backend": "ray",
            "trainer.n_gpus_per_node": 2, "trainer.num_threads": 1, "trainer.total_training_steps": 2,
            "trainer.val_before_train": False, "trainer.report": False, "actor_rollout_ref.actor.optim.lr": 0.05,
            **layout})
        trainer = run_ppo(cfg)
    finally:
        ray.shutdown()
    steps = [row for row in trainer.metrics_history if "timing_s/step" in row]
    assert [row["step"] for row in steps] == [1, 2]
    for row in steps:
        assert row["timing_s/update_weights"] > 0.0
        if layout:  # one batch ahead: the second step's samples are one version old, weighed by decoupled PPO
            assert row["async/staleness_max"] == float(row["step"] - 1)
            continue
        assert 0.0 <= row["training/rollout_log_probs_diff_max"] < 1e-3
        assert row["rollout/weights_version"] == row["step"] - 1  # every engine: the actor's weights before the step
        assert row["global_seqlen/balanced_max"] <= row["global_seqlen/max"]
