"""The command line (``rlvr --help-config``, ``--print-config``, config errors) and the checks the
trainer makes before any worker starts."""

from __future__ import annotations

import pytest
from trainer_helpers import tiny_config

from rlvr.trainer.config import load_config
from rlvr.trainer.main_ppo import build_role_worker_mapping, main
from rlvr.trainer.ppo.ray_trainer import RayPPOTrainer, ResourcePoolManager
from rlvr.trainer.ppo.utils import Role
from rlvr.utils.errors import ConfigError
from rlvr.utils.testing import tiny_tokenizer
from rlvr.workers.engine_workers import ActorRolloutRefWorker, CriticWorker


def test_help_config(capsys):
    assert main(["--help-config"]) == 0
    out = capsys.readouterr().out
    assert "  algorithm.adv_estimator = 'grpo'\n      advantage estimator from the registry" in out


def test_config_error_exits_with_2_and_names_the_key(capsys, tmp_path):
    assert main(["--preset", "grpo", f"data.train_files={tmp_path / 'missing.jsonl'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rlvr: config error at 'data.train_files': data file")


def test_print_config_applies_preset_and_overrides(capsys, tmp_path):
    data = tmp_path / "t.jsonl"
    data.write_text("")
    assert main(["--preset", "rloo", f"data.train_files={data}", "trainer.seed=5", "--print-config"]) == 0
    out = capsys.readouterr().out
    assert "adv_estimator: rloo" in out and "seed: 5" in out


def test_role_worker_mapping_follows_the_config():
    mapping, pools = build_role_worker_mapping(load_config("ppo"))
    assert mapping == {Role.ActorRollout: ActorRolloutRefWorker, Role.Critic: CriticWorker,
                       Role.RefPolicy: ActorRolloutRefWorker}
    assert set(pools.values()) == {"global_pool"}
    mapping, _ = build_role_worker_mapping(load_config("grpo", ["actor_rollout_ref.model.lora_rank=4"]))
    assert mapping == {Role.ActorRollout: ActorRolloutRefWorker}  # the LoRA actor provides the reference
    mapping, _ = build_role_worker_mapping(load_config("drgrpo"))
    assert mapping == {Role.ActorRollout: ActorRolloutRefWorker}  # no KL term: no reference


def test_trainer_checks_roles_before_any_worker_starts(tiny_model_dir, tiny_data, tmp_path):
    pools = ResourcePoolManager({"global_pool": [1]}, {Role.ActorRollout: "global_pool"}, use_gpu=False,
                                backend="local")
    actor_only = {Role.ActorRollout: ActorRolloutRefWorker}
    cases = [("grpo", {}, "actor_rollout_ref.actor.use_kl_loss", "needs a reference policy: add Role.RefPolicy"),
             ("ppo", {"actor_rollout_ref.rollout.n": 2}, "critic.enable", "has no Role.Critic")]
    for preset, extra, key, message in cases:
        cfg = tiny_config(tiny_model_dir, tiny_data, tmp_path, preset=preset, **extra)
        with pytest.raises(ConfigError, match=message) as info:
            RayPPOTrainer(cfg, tiny_tokenizer(), actor_only, pools, reward_fn=object())
        assert info.value.key == key
    cfg = tiny_config(tiny_model_dir, tiny_data, tmp_path, preset="drgrpo")
    with pytest.raises(ConfigError, match="needs a reward_fn"):
        RayPPOTrainer(cfg, tiny_tokenizer(), actor_only, pools)
    trainer = RayPPOTrainer(cfg, tiny_tokenizer(), actor_only, pools, reward_fn=object())
    assert trainer.total_training_steps == 3 and not trainer.use_reference and not trainer.use_critic
