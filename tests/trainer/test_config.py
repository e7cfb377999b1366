"""Config loading (presets, overrides) and validation: each error names the key and what to change."""

from __future__ import annotations

import pytest

from rlvr.trainer.config import check_config, help_config, list_presets, load_config, validate_config
from rlvr.utils.errors import ConfigError

from trainer_helpers import tiny_overrides

from rlvr.utils.testing import save_tiny_reward_model

PPO_N1 = {"actor_rollout_ref.rollout.n": 1, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 4,
          "critic.ppo_micro_batch_size_per_gpu": 4}
APART = {"actor_rollout_ref.hybrid_engine": False}
PRESETS = ["dapo", "distill_job", "drgrpo", "egpo", "grpo", "gspo", "main_job", "moe_job", "ppo", "reinforce_pp",
           "remax", "rloo", "rlvr_mixed", "rm_job", "tool_job", "vision_job"]


@pytest.fixture
def overrides(tiny_model_dir, tiny_data, tmp_path):
    def make(**extra):
        return tiny_overrides(tiny_model_dir, tiny_data, tmp_path / "run", **extra)

    return make


@pytest.mark.slow
def test_every_preset_is_shipped_and_valid(overrides, tmp_path, tiny_model_dir):
    assert list_presets() == PRESETS
    tools = tmp_path / "tools.yaml"
    tools.write_text("tools:\n  - class_name: rlvr.agent.tools.calculator.CalculatorTool\n")
    for preset in PRESETS:
        extra = PPO_N1 if preset == "ppo" else {"reward_model.overlong_buffer.len": 4}
        if preset == "tool_job":
            extra["actor_rollout_ref.rollout.multi_turn.tool_config_path"] = str(tools)
        if preset == "rlvr_mixed":  # the tiny data's domain needs a route too
            extra = {**extra, "reward.routes.tiny": "naive"}
        if preset == "rm_job":  # a trained reward model and the tiny data's route to it
            rm = save_tiny_reward_model(tmp_path / "rm")
            extra = {**extra, "reward.reward_model.model_path": rm, "reward.routes.tiny": "'reward_model+0*naive'"}
        if preset == "distill_job":  # a teacher with the student's tokenizer
            extra = {**extra, "distillation.teacher_models.teacher_model.model_path": tiny_model_dir}
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
    gspo = load_config("gspo", overrides()).actor_rollout_ref.actor
    assert (gspo.policy_loss.loss_mode, gspo.clip_ratio_low, gspo.clip_ratio_high) == ("gspo", 3e-4, 4e-4)


def test_derived_fields(overrides):
    cfg = load_config("grpo", overrides(**{"data.max_response_length": 12, "trainer.seed": 11}))
    assert cfg.actor_rollout_ref.rollout.response_length == 12
    assert cfg.actor_rollout_ref.rollout.prompt_length == 32
    assert cfg.data.seed == 11
    assert cfg.critic.model.path == cfg.critic.model.tokenizer_path == cfg.actor_rollout_ref.model.path
    own = load_config(None, ["actor_rollout_ref.model.tokenizer_path=/tok", "critic.model.path=/critic"]).critic.model
    assert (own.path, own.tokenizer_path) == ("/critic", "/tok")  # the critic reads the policy's token ids
    assert cfg.critic.enable is False  # grpo preset
    assert load_config(None, ["algorithm.adv_estimator=gae"]).critic.enable is True  # None follows the estimator


def test_unknown_key_and_bad_type_name_the_key():
    with pytest.raises(ConfigError, match=r"'trainer.sed': unknown key .*--help-config"):
        load_config("grpo", ["trainer.sed=3"])
    with pytest.raises(ConfigError, match=r"'trainer.seed': wrong value type .*'abc'"):
        load_config("grpo", ["trainer.seed=abc"])
    with pytest.raises(ConfigError, match=r"'preset': unknown preset 'nope'; use one of dapo, distill_job, drgrpo"):
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
    ({"algorithm.adv_estimator": "grpoo"}, "algorithm.adv_estimator",
     r"'grpoo' is not valid \(did you mean 'grpo'\?\); use one of egpo, gae, gdpo, gpg, grpo"),
    ({"actor_rollout_ref.actor.policy_loss.loss_mode": "nope"}, "actor_rollout_ref.actor.policy_loss.loss_mode",
     "'nope' is not valid; use one of .*vanilla"),
    ({"reward_model.reward_manager": "nope"}, "reward_model.reward_manager",
     "'nope' is not valid; use one of batch, dapo, naive"),
    ({"reward_model.on_error": "ignore"}, "reward_model.on_error",
     "'ignore' is not valid; use one of raise, fallback, fallback_timeouts"),
    # a schema field with fixed choices (a str with metadata choices: OmegaConf 2.3 has no Literal)
    ({"reward.route_key": "tags"}, "reward.route_key", r"'tags' is not valid \(did you mean 'tag'\?\); use one of data_source, tag"),
    ({"reward.workers.general_val.match_mode": "fuzzy"}, "reward.workers.general_val.match_mode",
     "'fuzzy' is not valid; use one of exact, contains"),
    ({"reward.workers.code_sandbox.sandbox.isolation": "docker"}, "reward.workers.code_sandbox.sandbox.isolation",
     "use one of auto, namespaces, basic"),
    ({"actor_rollout_ref.rollout.name": "vllm_x"}, "actor_rollout_ref.rollout.name", "'vllm_x'.*hf"),
    ({"trainer.backend": "slurm"}, "trainer.backend", "'slurm' is not valid; use one of ray, local"),
    ({"trainer.backend": "rey"}, "trainer.backend", r"'rey' is not valid \(did you mean 'ray'\?\); use one of"),
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
    # loss and estimator knobs
    ({"algorithm.singleton_advantage": "raw"}, "algorithm.singleton_advantage", "'raw' is not valid"),
    ({"algorithm.gpg_alpha_count": "all"}, "algorithm.gpg_alpha_count", "use one of nonzero_score, informative"),
    ({"algorithm.egpo_alpha": 1.5}, "algorithm.egpo_alpha", r"must be in \[0, 1\]"),
    ({"algorithm.egpo_uncertainty_norm": "token"}, "algorithm.egpo_uncertainty_norm", "use one of group, batch"),
    ({"actor_rollout_ref.actor.policy_loss.kl_cov_ratio": 0.0}, "actor_rollout_ref.actor.policy_loss.kl_cov_ratio",
     "must be > 0"),
    ({"actor_rollout_ref.actor.policy_loss.clip_cov_lb": 6.0}, "actor_rollout_ref.actor.policy_loss.clip_cov_lb",
     "must be below clip_cov_ub=5.0"),
    # rollout placement and the asynchronous schedule
    ({"async_training.mode": "bounded"}, "async_training.mode",
     "needs a rollout of its own: set actor_rollout_ref.hybrid_engine=false"),
    ({**APART, "async_training.mode": "fast"}, "async_training.mode", "'fast' is not valid; use one of sync, one_step"),
    ({**APART, "async_training.staleness_policy": "skip"}, "async_training.staleness_policy", "use one of wait, drop"),
    ({**APART, "async_training.mode": "one_step", "async_training.max_staleness": 2}, "async_training.mode",
     "one_step is the bounded schedule with max_staleness=1"),
    ({**APART, "async_training.mode": "one_step", "async_training.partial_rollout": True},
     "async_training.partial_rollout", r"only mode=bounded does while it generates \(mode=one_step\)"),
    ({**APART, "async_training.partial_rollout": True}, "async_training.partial_rollout",
     "only mode=bounded does while it generates"),
    ({**APART, "async_training.mode": "bounded", "async_training.trigger_parameter_sync_step": 3},
     "async_training.trigger_parameter_sync_step", "would wait forever; use trigger_parameter_sync_step <= 2"),
    ({**APART, "async_training.max_staleness": -1}, "async_training.max_staleness", "must be >= 0"),
    ({**APART, "rollout.n_gpus_per_node": 2}, "rollout.n_gpus_per_node", "runs the rollout in one child process"),
    ({**APART, "async_training.prox_log_prob_from_update": True}, "async_training.prox_log_prob_from_update",
     r"no proximal log-probs to take from the update without decoupled PPO \(mode=sync"),
    ({**APART, "async_training.mode": "one_step", "async_training.prox_log_prob_from_update": True,
      "actor_rollout_ref.actor.ppo_mini_batch_size": 2, "algorithm.rollout_correction.rollout_rs": "token"},
     "async_training.prox_log_prob_from_update",
     r"ppo_mini_batch_size=2 < data.train_batch_size=4 \(several optimizer steps per batch\); "
     r"algorithm.rollout_correction.rollout_rs .*Unset it"),
    ({**APART, "async_training.mode": "one_step", "async_training.prox_log_prob_from_update": True,
      "algorithm.adv_estimator": "egpo"}, "async_training.prox_log_prob_from_update",
     "algorithm.adv_estimator=egpo reads old_log_prob"),
    ({**APART, "algorithm.adv_estimator": "remax"}, "algorithm.adv_estimator", "needs a greedy baseline"),
    ({"async_training.lend_idle_cores": True}, "async_training.lend_idle_cores",
     r"the rollout is colocated with the actor \(set actor_rollout_ref.hybrid_engine=false\)"),
    ({**APART, "async_training.lend_idle_cores": True, "trainer.num_threads": 2}, "async_training.lend_idle_cores",
     r"trainer.num_threads=2 fixes the thread count \(unset it\)"),
    ({**APART, "async_training.lend_idle_cores": True, "trainer.backend": "ray"}, "async_training.lend_idle_cores",
     r"trainer.backend=ray \(Ray places the workers itself; use trainer.backend=local\)"),
    ({**APART, "async_training.mode": "bounded", "async_training.partial_rollout": True,
      "actor_rollout_ref.rollout.name": "test_uninterruptible"}, "async_training.partial_rollout",
     "cannot be interrupted in the middle of a generation"),
    # keys a verl config sets: validated
    ({"actor_rollout_ref.actor.strategy": "deepspeed"}, "actor_rollout_ref.actor.strategy",
     "'deepspeed' is not a training backend; use one of fsdp, fsdp2, megatron"),
    ({"actor_rollout_ref.ref.strategy": "fsdp3"}, "actor_rollout_ref.ref.strategy", "'fsdp3' is not a training backend"),
    ({"actor_rollout_ref.actor.global_batch_info.dp_size": 2}, "actor_rollout_ref.actor.global_batch_info",
     "filled in by the actor worker"),
]


@pytest.fixture(scope="module", autouse=True)
def uninterruptible_engine():
    """An engine registered as not interruptible (what partial rollouts refuse)."""
    from rlvr.workers.rollout import ROLLOUT_ENGINES, register_rollout_engine
    from rlvr.workers.rollout.hf_rollout import HFRollout

    @register_rollout_engine("test_uninterruptible")
    class Uninterruptible(HFRollout):
        interruptible = False

    yield
    del ROLLOUT_ENGINES["test_uninterruptible"]


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


@pytest.fixture
def user_estimators():
    """Two user-registered estimators (a value baseline that needs a critic, a group mean that needs
    groups), removed again afterwards."""
    from rlvr.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, register_adv_est

    @register_adv_est("test_value_baseline", needs_critic=True)
    def value_baseline(token_level_rewards, response_mask, values=None, **kwargs):
        adv = (token_level_rewards.sum(-1, keepdim=True) - values) * response_mask
        return adv, adv

    @register_adv_est("test_group_mean", needs_groups=True)
    def group_mean(token_level_rewards, response_mask, index=None, **kwargs):
        return token_level_rewards, token_level_rewards

    yield
    for name in ("test_value_baseline", "test_group_mean"):
        del ADV_ESTIMATOR_REGISTRY[name]


def test_user_estimator_that_needs_a_critic_is_handled_like_gae(overrides, user_estimators):
    ppo = {"actor_rollout_ref.rollout.n": 1, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 4,
           "critic.ppo_micro_batch_size_per_gpu": 4}
    for estimator in ("gae", "test_value_baseline"):
        cfg = load_config(None, overrides(**ppo, **{"algorithm.adv_estimator": estimator}))
        assert cfg.critic.enable is True  # unset: the registry entry says it needs one
        validate_config(cfg)
        cfg = load_config(None, overrides(**ppo, **{"algorithm.adv_estimator": estimator, "critic.enable": False}))
        with pytest.raises(ConfigError, match=f"adv_estimator={estimator} needs a critic; set critic.enable=True"
                           ) as info:
            validate_config(cfg)
        assert info.value.key == "critic.enable"


def test_user_estimator_that_needs_groups_is_handled_like_grpo(overrides, user_estimators):
    for estimator in ("grpo", "test_group_mean"):
        cfg = load_config(None, overrides(**{"algorithm.adv_estimator": estimator}))
        assert cfg.critic.enable is False
        validate_config(cfg)
        cfg = load_config("grpo", overrides(**{"algorithm.adv_estimator": estimator,
                                               "actor_rollout_ref.rollout.n": 1}))
        with pytest.raises(ConfigError, match=f"adv_estimator={estimator} compares the samples of one prompt"):
            validate_config(cfg)


def test_verl_strategies_are_accepted_and_critic_strategy_checked(overrides):
    for strategy in ("fsdp", "fsdp2"):
        validate_config(load_config("grpo", overrides(**{"actor_rollout_ref.actor.strategy": strategy})))
    ppo = {"actor_rollout_ref.rollout.n": 1, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 4,
           "critic.ppo_micro_batch_size_per_gpu": 4}
    validate_config(load_config("ppo", overrides(**ppo, **{"critic.strategy": "fsdp"})))
    with pytest.raises(ConfigError, match="'deepspeed' is not a training backend") as info:
        validate_config(load_config("ppo", overrides(**ppo, **{"critic.strategy": "deepspeed"})))
    assert info.value.key == "critic.strategy"


def test_a_routed_code_sandbox_that_cannot_run_is_a_config_error():
    """The local code sandbox is started with the config check, not at the first reward."""
    routed = ["reward.routes.code=code_sandbox"]
    check_config(load_config("grpo", routed), require_data_files=False)  # this machine's sandbox works
    bad = [*routed, "reward.workers.code_sandbox.sandbox.python_executable=/nonexistent/python3"]
    with pytest.raises(ConfigError, match=r"reward.workers.code_sandbox.sandbox.python_executable.*"
                                          r"'/nonexistent/python3' is not an executable file"):
        check_config(load_config("grpo", bad), require_data_files=False)
    # a remote sandbox service is not probed here
    check_config(load_config("grpo", [*bad, "reward.workers.code_sandbox.sandbox_url=http://127.0.0.1:9"]),
                 require_data_files=False)
