"""The trainer wired as verl 0.9's ``main_ppo`` wires it: worker classes wrapped with ``ray.remote``
in ``role_worker_mapping``, a ``ResourcePoolManager`` and a worker-group class (local backend,
tiny random model, one GRPO step)."""

from __future__ import annotations

import math

import pytest
from trainer_helpers import tiny_config

from rlvr.single_controller import LocalWorkerGroup
from rlvr.trainer.main_ppo import build_role_worker_mapping
from rlvr.trainer.ppo.ray_trainer import RayPPOTrainer, ResourcePoolManager
from rlvr.trainer.ppo.reward import load_reward_manager
from rlvr.trainer.ppo.utils import Role
from rlvr.utils.tokenizer import hf_tokenizer


def test_ray_remote_worker_classes_in_role_worker_mapping(tiny_model_dir, tiny_data, tmp_path):
    ray = pytest.importorskip("ray")
    cfg = tiny_config(tiny_model_dir, tiny_data, tmp_path / "run", preset="grpo",
                      **{"trainer.total_training_steps": 1, "trainer.val_before_train": False})
    tokenizer = hf_tokenizer(str(tiny_model_dir))
    plain, mapping = build_role_worker_mapping(cfg)
    role_worker_mapping = {role: ray.remote(cls) for role, cls in plain.items()}
    pools = ResourcePoolManager(resource_pool_spec={"global_pool": [1]}, mapping=mapping, use_gpu=False,
                                backend="local")
    trainer = RayPPOTrainer(config=cfg, tokenizer=tokenizer, role_worker_mapping=role_worker_mapping,
                            resource_pool_manager=pools, ray_worker_group_cls=LocalWorkerGroup,
                            reward_fn=load_reward_manager(cfg, tokenizer, num_examine=0), device_name="cpu")
    try:
        trainer.init_workers()
        trainer.fit()
    finally:
        trainer.shutdown()
    (step,) = trainer.metrics_history
    assert step["step"] == 1 and math.isfinite(step["actor/pg_loss"]) and 0.0 <= step["train/tiny/score"] <= 1.0
    assert type(trainer.actor_rollout_wg._worker_cls.raw_cls_dict["actor_rollout"]) is type  # unwrapped class
    assert Role.ActorRollout in role_worker_mapping
