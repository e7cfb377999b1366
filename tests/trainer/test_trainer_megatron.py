"""End-to-end runs of the trainer with strategy=megatron on the local backend (tensor parallel 2: the
driver's worker starts the second rank): the same loop as FSDP2 trains, GAE with a Megatron critic,
exact resume from a checkpoint of Megatron shards, HF export."""

from __future__ import annotations

import gc

import pytest
from trainer_helpers import tiny_config

pytestmark = pytest.mark.megatron
pytest.importorskip("megatron.core")

from transformers import AutoModelForCausalLM  # noqa: E402

from rlvr.trainer.main_ppo import build_role_worker_mapping, run_ppo  # noqa: E402
from rlvr.trainer.ppo.utils import Role  # noqa: E402
from rlvr.workers.megatron.local_ranks import shutdown_local_ranks  # noqa: E402
from rlvr.workers.megatron.workers import MegatronActorRolloutRefWorker, MegatronCriticWorker  # noqa: E402

MEGATRON = {"actor_rollout_ref.actor.strategy": "megatron", "critic.strategy": "megatron",
            "actor_rollout_ref.actor.megatron.tensor_model_parallel_size": 2}


def _comparable(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if not k.startswith(("timing", "perf/", "rollout/weights_version"))} for row in rows]


@pytest.fixture
def run(tiny_model_dir, tiny_data, tmp_path):
    def go(name: str, preset: str = "grpo", **extra):
        return run_ppo(tiny_config(tiny_model_dir, tiny_data, tmp_path / name, preset=preset, **MEGATRON, **extra))

    yield go
    gc.collect()
    shutdown_local_ranks()


def test_the_strategy_picks_the_worker_classes(tiny_model_dir, tiny_data, tmp_path):
    cfg = tiny_config(tiny_model_dir, tiny_data, tmp_path, preset="ppo", **MEGATRON,
                      **{"actor_rollout_ref.actor.use_kl_loss": True})
    mapping, _ = build_role_worker_mapping(cfg)
    assert mapping == {Role.ActorRollout: MegatronActorRolloutRefWorker, Role.Critic: MegatronCriticWorker,
                       Role.RefPolicy: MegatronActorRolloutRefWorker}


def test_megatron_grpo_resumes_exactly_and_exports(run, tmp_path):
    extra = {"trainer.save_freq": 1, "trainer.report": False, "trainer.val_before_train": False,
             "trainer.total_training_steps": 2, "trainer.export_hf": True}
    first = run("a", **extra).metrics_history
    assert first[0]["actor/grad_norm"] > 0 and first[0]["critic/score/mean"] != first[1]["critic/score/mean"]
    actor = tmp_path / "a/checkpoints/global_step_1/actor"  # trainer.export_hf: verl's hf_model content too
    assert sorted(p.name for p in actor.iterdir()) == ["huggingface", "megatron_tp0_pp0.pt", "megatron_tp1_pp0.pt"]
    assert (actor / "huggingface" / "config.json").is_file()
    resumed = run("b", **extra, **{"trainer.resume_mode": "resume_path",
                                   "trainer.resume_from_path": str(tmp_path / "a/checkpoints/global_step_1")})
    assert [r["step"] for r in resumed.metrics_history] == [2, 2]
    assert _comparable(resumed.metrics_history) == _comparable(first[1:])
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "a/hf_model").config.model_type == "llama"


def test_megatron_ppo_with_a_critic_and_a_reference_trains(run):
    rows = run("ppo", preset="ppo", **{"trainer.total_training_steps": 2, "trainer.report": False,
                                       "trainer.val_before_train": False, "actor_rollout_ref.actor.use_kl_loss": True}
               ).metrics_history
    assert rows[-2]["critic/vf_loss"] > 0 and rows[-2]["actor/kl_loss"] >= 0 and rows[-2]["critic/grad_norm"] > 0


def test_megatron_lora_grpo_trains_the_adapters_against_the_actors_base(run, tiny_model_dir, tiny_data, tmp_path):
    lora = {"actor_rollout_ref.model.lora.rank": 4, "actor_rollout_ref.model.lora.alpha": 8,
            "actor_rollout_ref.actor.use_kl_loss": True, "actor_rollout_ref.actor.optim.lr": 0.01}
    mapping, _ = build_role_worker_mapping(tiny_config(tiny_model_dir, tiny_data, tmp_path, **MEGATRON, **lora))
    assert Role.RefPolicy not in mapping  # the reference is the actor's stage with its adapters off
    rows = run("lora", **lora, **{"trainer.report": False, "trainer.val_before_train": False,
                                  "trainer.total_training_steps": 2}).metrics_history
    rows = [row for row in rows if "actor/kl_loss" in row]  # the training steps (not the final validation)
    assert [row["step"] for row in rows] == [1, 2] and all(row["actor/grad_norm"] > 0 for row in rows)
    assert rows[0]["actor/kl_loss"] < 1e-6 < rows[1]["actor/kl_loss"]  # the actor starts as the base model, then moves
