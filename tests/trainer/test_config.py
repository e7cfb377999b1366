"""Config loading (presets, overrides) and validation: each error names the key and what to change."""

from __future__ import annotations

import pytest

from rlvr.trainer.config import help_config, list_presets, load_config, validate_config
from rlvr.utils.errors import ConfigError

from trainer_helpers import tiny_overrides

PPO_N1 = {"actor_rollout_ref.rollout.n": 1, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 4,
          "critic.ppo_micro_batch_size_per_gpu": 4}
PRESETS = ["dapo", "drgrpo", "egpo", "grpo", "main_job", "ppo", "reinforce_pp", "remax", "rloo", "tool_job"]


@pytest.fixture
def overrides(tiny_model_dir, tiny_data, tmp_path):
    def make(**extra):
        return tiny_overrides(tiny_model_dir, tiny_data, tmp_path / "run", **extra)

    return make


def test_every_preset_is_shipped_and_valid(overrides, tmp_path):
    assert list_presets() == PRESETS
    tools = tmp_path / "tools.yaml"
    tools.write_text("tools:\n  - class_name: rlvr.agent.tools.calculator.CalculatorTool\n")
    for preset in PRESETS:
        extra = PPO_N1 if preset == "ppo" else {"reward_model.overlong_buffer.len": 4}
        if preset == "tool_job":
            extra["actor_rollout_ref.rollout.multi_turn.tool_config_path"] = str(tools)
        cfg = load_config(preset, overrides(**extra))
        validate_config(cfg)
        assert cfg.trainer.backend == "local"


def test_preset_values_and_inheritance(overrides):
    dapo = load_config("dapo", overrides())
    assert dapo.algorithm.adv_estimator == "grpo"  # from base: grpo
    assert dapo.algorithm.filter_groups.enable is True
    assert dapo.actor_rollout_ref.actor.clip_ratio_high == 0.28
    drgrpo = load_config("drgrpo", overrides())
    assert drgrpo.algorithm.norm_adv_by_std_in_grpo is False
    assert drgrpo.actor_rollout_ref.actor.loss_agg_mode == "seq-mean-token-sum-norm"
    ppo = load_config("ppo", overrides())
    assert ppo.algorithm.adv_estimator == "gae" and ppo.critic.enable is True


def test_derived_fields(overrides):
    cfg = load_config("grpo", overrides(**{"data.max_response_length": 12, "trainer.seed": 11}))
    assert cfg.actor_rollout_ref.rollout.response_length == 12
    assert cfg.actor_rollout_ref.rollout.prompt_length == 32
    assert cfg.data.seed == 11
    assert cfg.critic.model.path == cfg.actor_rollout_ref.model.path
    assert cfg.critic.enable is False  # grpo preset
    assert load_config(None, ["algorithm.adv_estimator=gae"]).critic.enable is True  # None follows the estimator


def test_unknown_key_and_bad_type_name_the_key():
    with pytest.raises(ConfigError, match=r"'trainer.sed': unknown key .*--help-config"):
        load_config("grpo", ["trainer.sed=3"])
    with pytest.raises(ConfigError, match=r"'trainer.seed': wrong value type .*'abc'"):
        load_config("grpo", ["trainer.seed=abc"])
    with pytest.raises(ConfigError, match=r"'preset': unknown preset 'nope'; use one of dapo, drgrpo"):
        load_config("nope")
    with pytest.raises(ConfigError, match=r"must look like key=value"):
        load_config("grpo", ["trainer.seed"])


def test_help_config_lists_every_field_with_help():
    text = help_config()
    assert "  trainer.seed = 1\n      one seed for init, sampling and data order" in text
    assert "[actor_rollout_ref.rollout.val_kwargs]" in text
    assert "  algorithm.filter_groups.max_num_gen_batches = 10" in text


CASES = [
    ({"data.train_batch_size": 6}, "actor_rollout_ref.actor.ppo_mini_batch_size",
     "data.train_batch_size=6 is not a multiple of ppo_mini_batch_size=4"),
    ({"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 3}, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
     "each worker gets 16 sequences per mini-batch .* not a multiple of ppo_micro_batch_size_per_gpu=3"),
    ({"trainer.backend": "ray", "trainer.n_gpus_per_node": 3}, "actor_rollout_ref.actor.ppo_mini_batch_size",
     "16 sequences does not split over 3 workers"),
    ({"actor_rollout_ref.rollout.n": 1}, "actor_rollout_ref.rollout.n",
     "algorithm.adv_estimator=grpo compares the samples of one prompt, so it needs rollout.n > 1"),
    ({"algorithm.adv_estimator": "rloo", "actor_rollout_ref.rollout.n": 1}, "actor_rollout_ref.rollout.n",
     "adv_estimator=rloo .* needs rollout.n > 1"),
    ({"algorithm.adv_estimator": "gae", "critic.enable": False}, "critic.enable",
     "adv_estimator=gae needs a critic; set critic.enable=True"),
    ({"algorithm.adv_estimator": "grpo_typo"}, "algorithm.adv_estimator",
     "unknown advantage estimator 'grpo_typo'; valid names: egpo, gae, gpg, grpo"),
    ({"actor_rollout_ref.actor.policy_loss.loss_mode": "nope"}, "actor_rollout_ref.actor.policy_loss.loss_mode",
     "unknown policy loss 'nope'; valid names: .*vanilla"),
    ({"reward_model.reward_manager": "nope"}, "reward_model.reward_manager",
     "unknown reward manager 'nope'; valid names: batch, dapo, naive"),
    ({"actor_rollout_ref.rollout.name": "vllm_x"}, "actor_rollout_ref.rollout.name", "'vllm_x'.*hf"),
    ({"trainer.backend": "slurm"}, "trainer.backend", "'slurm' is not valid; use one of ray, local"),
    ({"data.train_files": "/nonexistent/train.jsonl"}, "data.train_files",
     "data file '/nonexistent/train.jsonl' does not exist"),
    ({"data.val_files": "/nonexistent/val.parquet"}, "data.val_files", "does not exist"),
    ({"actor_rollout_ref.actor.kl_loss_type": "k9"}, "actor_rollout_ref.actor.kl_loss_type", "'k9' is not valid"),
    ({"actor_rollout_ref.actor.kl_loss_type": "full"}, "actor_rollout_ref.actor.kl_loss_type",
     "'full' needs full-vocabulary log-probs.*use low_var_kl"),
    ({"algorithm.kl_penalty": "full"}, "algorithm.kl_penalty", "'full' needs full-vocabulary log-probs"),
    ({"algorithm.kl_ctrl.type": "pid"}, "algorithm.kl_ctrl.type", "use one of fixed, adaptive"),
    ({"trainer.logger": "[console,mlflow]"}, "trainer.logger", "unknown logger 'mlflow'"),
    ({"trainer.resume_mode": "resume_path"}, "trainer.resume_from_path", "needs an existing checkpoint directory"),
    ({"trainer.n_gpus_per_node": 2}, "trainer.n_gpus_per_node", "the local backend runs one worker"),
    ({"actor_rollout_ref.rollout.temperature": 0.0}, "actor_rollout_ref.rollout.temperature",
     "sampling needs temperature > 0"),
    ({"algorithm.filter_groups.metric": "length"}, "algorithm.filter_groups.metric", "use one of acc, score"),
    ({"actor_rollout_ref.actor.loss_agg_mode": "mean"}, "actor_rollout_ref.actor.loss_agg_mode",
     "use one of token-mean"),
    ({"trainer.test_freq": 0}, "trainer.test_freq", "use -1"),
    ({"reward_model.overlong_buffer.enable": True, "reward_model.overlong_buffer.len": 9},
     "reward_model.overlong_buffer.len", r"use a length in \(0, data.max_response_length=8\], got 9"),
    ({"custom_reward_function.path": "/nonexistent.py"}, "custom_reward_function.path", "does not exist"),
]


@pytest.mark.parametrize(("extra", "key", "message"), CASES, ids=[c[1] + ":" + str(i) for i, c in enumerate(CASES)])
def test_validation_errors(overrides, extra, key, message):
    cfg = load_config("grpo", overrides(**extra))
    with pytest.raises(ConfigError, match=message) as info:
        validate_config(cfg)
    assert info.value.key == key


def test_critic_batch_sizes_checked_only_with_a_critic(overrides):
    validate_config(load_config("grpo", overrides(**{"critic.ppo_mini_batch_size": 3})))
    cfg = load_config("ppo", overrides(**{**PPO_N1, "critic.ppo_mini_batch_size": 3}))
    with pytest.raises(ConfigError, match="not a multiple of ppo_mini_batch_size=3") as info:
        validate_config(cfg)
    assert info.value.key == "critic.ppo_mini_batch_size"


def test_missing_train_files(overrides):
    cfg = load_config("grpo", overrides(**{"data.train_files": "null"}))
    with pytest.raises(ConfigError, match="no training data given") as info:
        validate_config(cfg)
    assert info.value.key == "data.train_files"
    validate_config(cfg, require_data_files=False)
