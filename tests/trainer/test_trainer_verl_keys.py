"""verl's trainer-level keys in one local PPO run: rollout.calculate_log_probs=false (no rollout
log-probs: no mismatch metrics, nothing to reuse), actor.calculate_entropy (the old-log-prob pass
computes the entropy), checkpoint.save_contents with hf_model (a Hugging Face export in every
checkpoint) and max_critic_ckpt_to_keep (the smallest limit of the roles keeps whole checkpoints)."""

from __future__ import annotations

from transformers import AutoModelForCausalLM
from trainer_helpers import tiny_config

from rlvr.trainer.main_ppo import run_ppo
from rlvr.trainer.tracking import read_metrics
from rlvr.workers.actor.dp_actor import DataParallelPPOActor


def test_verl_trainer_keys_in_a_ppo_run(tiny_model_dir, tiny_data, tmp_path, monkeypatch):
    asked = []
    original = DataParallelPPOActor.compute_log_prob_stats

    def spy(self, data, calculate_entropy=False, *args, **kwargs):
        asked.append(calculate_entropy)
        return original(self, data, calculate_entropy, *args, **kwargs)

    monkeypatch.setattr(DataParallelPPOActor, "compute_log_prob_stats", spy)
    cfg = tiny_config(tiny_model_dir, tiny_data, tmp_path / "run", preset="ppo", **{
        "actor_rollout_ref.rollout.n": 2, "critic.ppo_micro_batch_size_per_gpu": 4,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 4, "trainer.total_training_steps": 2,
        "trainer.save_freq": 1, "trainer.val_before_train": False,
        "actor_rollout_ref.rollout.calculate_log_probs": False, "actor_rollout_ref.actor.calculate_entropy": True,
        "actor_rollout_ref.actor.checkpoint.save_contents": "[model,optimizer,extra,hf_model]",
        "trainer.max_actor_ckpt_to_keep": 3, "trainer.max_critic_ckpt_to_keep": 1,
    })
    run_ppo(cfg)
    rows = [row for row in read_metrics(tmp_path / "run" / "metrics.jsonl") if "actor/entropy" in row]
    assert len(rows) == 2 and all(row["actor/reused_rollout_log_probs"] == 0.0 for row in rows)
    assert not any(key.startswith("training/rollout_log_probs") for row in rows for key in row)
    assert True in asked  # the old-log-prob pass asked for the entropy
    checkpoints = tmp_path / "run" / "checkpoints"
    assert sorted(p.name for p in checkpoints.glob("global_step_*")) == ["global_step_2"]
    exported = AutoModelForCausalLM.from_pretrained(checkpoints / "global_step_2" / "actor" / "huggingface")
    assert exported.config.vocab_size == 260
