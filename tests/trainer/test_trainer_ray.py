"""End-to-end runs on a local Ray cluster with 2 CPU worker processes (FSDP2 over gloo): GRPO,
PPO with a critic and RLOO, with a tiny random Llama. One Ray start for the module."""

from __future__ import annotations

import pytest
import ray
from trainer_helpers import tiny_config

from rlvr.single_controller import init_ray
from rlvr.trainer.main_ppo import run_ppo

pytestmark = pytest.mark.ray

RAY = {"trainer.backend": "ray", "trainer.n_gpus_per_node": 2, "trainer.report": False, "trainer.num_threads": 1}


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    init_ray(num_cpus=2)
    yield
    ray.shutdown()


@pytest.mark.parametrize(("preset", "extra", "expected"), [
    # 5 validation prompts: padded to 6 over the 2 ranks and unpadded
    ("grpo", {"data.val_max_samples": 5, "trainer.total_training_steps": 2},
     ["actor/kl_loss", "timing_s/ref", "global_seqlen/balanced_max", "global_seqlen/groups_kept"]),
    pytest.param("ppo", {"actor_rollout_ref.rollout.n": 2, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 4,
                         "critic.ppo_micro_batch_size_per_gpu": 4, "trainer.total_training_steps": 1},
                 ["critic/vf_loss", "timing_s/update_critic"], marks=pytest.mark.slow),
    pytest.param("rloo", {"trainer.val_before_train": False, "trainer.total_training_steps": 1},
                 ["actor/reward_kl_penalty"], marks=pytest.mark.slow),
])
@pytest.mark.slow
def test_two_ray_workers(tiny_model_dir, tiny_data, tmp_path, preset, extra, expected):
    cfg = tiny_config(tiny_model_dir, tiny_data, tmp_path / "run", preset=preset, **{**RAY, **extra})
    trainer = run_ppo(cfg)
    steps = [row for row in trainer.metrics_history if "timing_s/step" in row]
    assert [row["step"] for row in steps] == list(range(1, cfg.trainer.total_training_steps + 1))
    for row in steps:
        missing = [k for k in ["train/tiny/acc", "actor/grad_norm", "perf/throughput", "timing_s/gen", *expected]
                   if k not in row]
        assert not missing, missing
        tokens, seconds = row["perf/total_num_tokens"], row["perf/time_per_step"]
        assert row["perf/throughput"] == pytest.approx(tokens / seconds / 2)  # per worker, 2 workers
        assert row["global_seqlen/balanced_max"] <= row["global_seqlen/max"]  # trainer.balance_batch: verl's default
    val = [row for row in trainer.metrics_history if "val/acc" in row]
    assert len(val) == (1 if preset == "rloo" else 2)
    assert (tmp_path / "run" / "checkpoints" / f"global_step_{len(steps)}" / "actor").is_dir()
