"""One GRPO step on the tiny model with each algorithm verl 0.9.1 added (local backend): the
estimators gdpo, grpo_passk, optimal_token_baseline (sum_pi_squared from the actor's old-log-prob
pass, variance-proxy metrics) and tir_optimal_token_baseline, each with one of the new losses
dppo_tv, dppo_kl, sapo and dro; and the config check's refusals of their missing settings."""

from __future__ import annotations

import math

import pytest
from trainer_helpers import tiny_config

from rlvr.trainer.config import validate_config
from rlvr.trainer.main_ppo import run_ppo
from rlvr.utils.errors import ConfigError

ONE_STEP = {"trainer.total_training_steps": 1, "trainer.val_before_train": False, "data.val_files": "null"}
RUNS = {
    "gdpo+dppo_tv": {"algorithm.adv_estimator": "gdpo", "algorithm.gdpo_reward_keys": "[score,acc]",
                     "algorithm.gdpo_reward_weights": "[1.0,0.5]",
                     "actor_rollout_ref.actor.policy_loss.loss_mode": "dppo_tv"},
    "grpo_passk+dppo_kl": {"algorithm.adv_estimator": "grpo_passk",
                           "actor_rollout_ref.actor.policy_loss.loss_mode": "dppo_kl"},
    "optimal_token_baseline+sapo": {"algorithm.adv_estimator": "optimal_token_baseline",
                                    "actor_rollout_ref.actor.calculate_sum_pi_squared": True,
                                    "actor_rollout_ref.actor.policy_loss.loss_mode": "sapo",
                                    "actor_rollout_ref.actor.tau_neg": 1.5},
    "tir_optimal_token_baseline+dro": {"algorithm.adv_estimator": "tir_optimal_token_baseline",
                                       "actor_rollout_ref.actor.calculate_sum_pi_squared": True,
                                       "actor_rollout_ref.actor.policy_loss.loss_mode": "dro",
                                       "actor_rollout_ref.actor.policy_loss.dro_beta": 0.1},
}


@pytest.mark.parametrize("name", list(RUNS))
def test_one_step(name, tiny_model_dir, tiny_data, tmp_path):
    cfg = tiny_config(tiny_model_dir, tiny_data, tmp_path / "run", **ONE_STEP, **RUNS[name])
    trainer = run_ppo(cfg)
    assert trainer.global_steps == 1
    row = trainer.metrics_history[-1]
    for key in ("actor/pg_loss", "actor/grad_norm", "critic/advantages/mean"):
        assert math.isfinite(row[key]), key
    assert row["actor/grad_norm"] > 0  # the loss moved the policy
    uses_sum_pi_squared = "optimal_token_baseline" in name
    assert ("variance_proxy/expected_w" in row) == uses_sum_pi_squared
    if uses_sum_pi_squared:
        assert row["variance_proxy/expected_w"] > 0  # sum_pi_squared reached the driver from the actor
        assert row["variance_proxy/proxy1_signal_strength"] == pytest.approx(row["actor/grad_norm"] ** 2)


@pytest.mark.parametrize(("extra", "key", "message"), [
    ({"algorithm.adv_estimator": "optimal_token_baseline"}, "actor_rollout_ref.actor.calculate_sum_pi_squared",
     "set actor_rollout_ref.actor.calculate_sum_pi_squared=true"),
    ({"actor_rollout_ref.actor.calculate_sum_pi_squared": True, "algorithm.rollout_correction.bypass_mode": True},
     "actor_rollout_ref.actor.calculate_sum_pi_squared", "bypass_mode=true skips"),
    ({"algorithm.adv_estimator": "gdpo"}, "algorithm.gdpo_reward_keys", "list the keys of your reward function"),
    ({"algorithm.gdpo_reward_keys": "[score]"}, "algorithm.gdpo_reward_keys", "read by the gdpo estimator only"),
    ({"algorithm.adv_estimator": "gdpo", "algorithm.gdpo_reward_keys": "[score,acc]",
      "algorithm.gdpo_reward_weights": "[1.0]"}, "algorithm.gdpo_reward_weights", "one weight per key"),
    ({"actor_rollout_ref.actor.policy_loss.loss_mode": "dro"}, "actor_rollout_ref.actor.policy_loss.dro_beta",
     "needs beta > 0"),
    ({"actor_rollout_ref.actor.tau_pos": 0.0}, "actor_rollout_ref.actor.tau_pos", "must be > 0"),
    ({"actor_rollout_ref.actor.policy_loss.loss_mode": "bypass_mode"},
     "actor_rollout_ref.actor.policy_loss.loss_mode", "algorithm.rollout_correction.bypass_mode=true"),
])
def test_missing_settings_are_refused_before_anything_starts(extra, key, message, tiny_model_dir, tiny_data, tmp_path):
    cfg = tiny_config(tiny_model_dir, tiny_data, tmp_path / "run", **extra)
    with pytest.raises(ConfigError, match=message) as err:
        validate_config(cfg)
    assert err.value.key == key
