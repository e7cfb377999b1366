"""verl's reward-model and distillation keys: the legacy keys mapped onto verl 0.9's sections when
the config loads, and every refusal of the config check with the key it names (torch-free)."""

from __future__ import annotations

import pytest

from rlvr.reward.rm_config import RMRolloutConfig
from rlvr.trainer.config import load_config
from rlvr.trainer.config.validate import check_config
from rlvr.trainer.config.validate_models import RM_SERVING_KNOBS, frozen_model_notes
from rlvr.utils.errors import ConfigError
from rlvr.workers.megatron.layout import megatron_installed

RM = "reward.reward_model"
TEACHER = "distillation.teacher_models.teacher_model"


def _cfg(*overrides: str):
    return load_config(None, ["trainer.backend=local", *overrides])


def _check(*overrides: str) -> None:
    check_config(_cfg(*overrides), require_data_files=False)


def test_legacy_reward_model_keys_map_onto_reward_reward_model():
    cfg = _cfg("reward_model.enable=true", "reward_model.model.path=/rm", "reward_model.model.input_tokenizer=/tok",
               "reward_model.micro_batch_size_per_gpu=3", "reward_model.max_length=99", "reward_model.use_dynamic_bsz=true",
               "reward_model.forward_max_token_len_per_gpu=500", "reward_model.enable_resource_pool=true",
               "reward_model.nnodes=1", "reward_model.n_gpus_per_node=2", "reward_model.rollout.name=vllm",
               "reward_model.model.trust_remote_code=true")
    rm = cfg.reward.reward_model
    assert (rm.enable, rm.model_path, rm.input_tokenizer, rm.micro_batch_size_per_gpu) == (True, "/rm", "/tok", 3)
    assert (rm.rollout.max_model_len, rm.use_dynamic_bsz, rm.forward_max_token_len_per_gpu) == (99, True, 500)
    assert (rm.enable_resource_pool, rm.nnodes, rm.n_gpus_per_node, rm.rollout.name) == (True, 1, 2, "vllm")
    assert rm.trust_remote_code is True
    with pytest.raises(ConfigError, match=r"reward_model.rollout.nmae.*unknown key"):
        _cfg("reward_model.rollout.nmae=vllm")


def test_reward_manager_and_custom_function_of_verl_09_map_onto_the_keys_rlvr_reads(tmp_path):
    assert _cfg("reward.reward_manager.name=dapo").reward_model.reward_manager == "dapo"
    cfg = _cfg("reward.reward_manager.source=importlib", "reward.reward_manager.module.path=my_rm.py",
               "reward.reward_manager.module.name=MyManager")
    assert cfg.reward_model.reward_manager == "my_rm.py:MyManager"
    legacy = _cfg("reward_model.reward_loop_source=importlib", "reward_model.reward_loop_module_path=m.py",
                  "reward_model.reward_loop_class_name=M")
    assert legacy.reward_model.reward_manager == "m.py:M"
    with pytest.raises(ConfigError, match=r"reward.reward_manager.*'batch' but reward_model.reward_manager .* 'dapo'"):
        _cfg("reward.reward_manager.name=batch", "reward_model.reward_manager=dapo")
    with pytest.raises(ConfigError, match=r"reward.reward_manager.source.*'plugin' is not a source"):
        _cfg("reward.reward_manager.source=plugin")
    with pytest.raises(ConfigError, match=r"reward.reward_manager.module.path.*source=importlib needs the file"):
        _cfg("reward.reward_manager.source=importlib")
    cfg = _cfg("reward.custom_reward_function.path=f.py", "reward.custom_reward_function.name=score")
    assert (cfg.custom_reward_function.path, cfg.custom_reward_function.name) == ("f.py", "score")
    with pytest.raises(ConfigError, match=r"reward.custom_reward_function.path.*set only one"):
        _cfg("reward.custom_reward_function.path=f.py", "custom_reward_function.path=g.py")


@pytest.mark.parametrize(("overrides", "key", "message"), [
    ((f"{RM}.enable=true",), f"{RM}.model_path", "enabled but has no model"),
    (("reward.routes.x=reward_model",), "reward.routes", "names 'reward_model' but the reward model is off"),
    ((f"{RM}.enable=true", f"{RM}.model_path=/rm", "reward.routes.x=naive"), "reward.routes",
     "no route names 'reward_model'"),
    ((f"{RM}.enable=true", f"{RM}.model_path=/rm", f"custom_reward_function.path={__file__}"), "custom_reward_function.path",
     "generative-RM pattern"),
    ((f"{RM}.enable=true", f"{RM}.model_path=/rm", "reward_model.reward_manager=dapo"), "reward_model.reward_manager",
     "the reward model alone scores every sample"),
    ((f"{RM}.enable=true", f"{RM}.model_path=/rm", f"{RM}.rollout.quantization=fp8"), f"{RM}.rollout.quantization",
     "would change the reward model's scores"),
    ((f"{RM}.enable=true", f"{RM}.model_path=/rm", f"{RM}.rollout.engine_kwargs.vllm.x=1"), f"{RM}.rollout.engine_kwargs",
     "starts no inference server"),
    ((f"{RM}.enable=true", f"{RM}.model_path=/rm", f"{RM}.rollout.skip_tokenizer_init=true"),
     f"{RM}.rollout.skip_tokenizer_init", "tokenizes its chat-templated input"),
    ((f"{RM}.enable=true", f"{RM}.model_path=/rm", f"{RM}.rollout.name=trtllm"), f"{RM}.rollout.name",
     "not an engine rlvr accepts"),
    ((f"{RM}.enable=true", f"{RM}.model_path=/rm", f"{RM}.enable_resource_pool=true"), f"{RM}.nnodes",
     "own pool has nnodes x n_gpus_per_node = 0"),
    ((f"{RM}.enable=true", f"{RM}.model_path=/rm", f"{RM}.enable_resource_pool=true", f"{RM}.nnodes=1"),
     f"{RM}.nnodes", "local backend runs one worker per pool"),
    (("reward.sandbox_fusion.url=http://sf",), "reward.sandbox_fusion.url", "not SandboxFusion's"),
    (("reward.routes.x='0.5*'",), "reward.routes", "has an empty term"),
    (("reward.routes.x='a*naive'",), "reward.routes", "'a' in 'a\\*naive' is not a number"),
    (("reward.routes.x='naive+naive'",), "reward.routes", "names 'naive' twice"),
])
def test_reward_model_refusals_name_the_key(overrides, key, message):
    with pytest.raises(ConfigError, match=rf"{key}.*{message}"):
        _check(*overrides)


DIST = ("distillation.enabled=true", f"{TEACHER}.model_path=/teacher")


@pytest.mark.parametrize(("overrides", "key", "message"), [
    (("distillation.enabled=true",), f"{TEACHER}.model_path", "has no model"),
    ((*DIST, "distillation.distillation_loss.loss_mode=k1"), "distillation.distillation_loss.loss_mode",
     "does not depend on the teacher"),
    ((*DIST, "distillation.distillation_loss.policy_loss_mode=gspo"), "distillation.distillation_loss.policy_loss_mode",
     "only vanilla"),
    ((*DIST, "distillation.distillation_loss.loss_mode=forward_kl_topk", "actor_rollout_ref.model.use_remove_padding=true"),
     "distillation.distillation_loss.loss_mode", "unpacked micro-batches"),
    ((*DIST, "distillation.distillation_loss.loss_mode=forward_kl_topk", "distillation.distillation_loss.topk=0"),
     "distillation.distillation_loss.topk", "needs the number of teacher tokens"),
    ((*DIST, "+distillation.teacher_models.second.model_path=/t2"), "distillation.teacher_models",
     "one teacher, under the entry teacher_model"),
    ((*DIST, f"{TEACHER}.inference.max_model_len=100"), f"{TEACHER}.inference.max_model_len",
     "prompt, the whole response and one more position: 385 tokens"),
    ((*DIST, "distillation.distillation_loss.loss_mode=forward_kl_topk", f"{TEACHER}.inference.engine_kwargs.vllm.max_logprobs=8"),
     f"{TEACHER}.inference.engine_kwargs.vllm.max_logprobs", "must be >= distillation_loss.topk=32"),
    ((*DIST, f"{TEACHER}.inference.engine_kwargs.sglang.x=1"), f"{TEACHER}.inference.engine_kwargs",
     "would configure nothing"),
    pytest.param((*DIST, "actor_rollout_ref.actor.strategy=megatron"), "distillation.enabled", "runs with the FSDP actor",
                 marks=[pytest.mark.megatron, pytest.mark.skipif(not megatron_installed(), reason="needs megatron-core")]),
    ((*DIST, "distillation.nnodes=2"), "distillation.nnodes", "local backend runs one worker per pool"),
    ((*DIST, "distillation.distillation_loss.loss_max_clamp=0"), "distillation.distillation_loss.loss_max_clamp",
     "must be > 0"),
])
def test_distillation_refusals_name_the_key(overrides, key, message):
    with pytest.raises(ConfigError, match=rf"{key}.*{message}"):
        _check(*[o.lstrip("+") for o in overrides])


def test_accepted_settings_pass_and_serving_knobs_get_a_note():
    cfg = _cfg(f"{RM}.enable=true", f"{RM}.model_path=/rm", f"{RM}.rollout.name=vllm", f"{RM}.rollout.gpu_memory_utilization=0.8",
               "reward.routes.x='reward_model+0*naive'", *DIST, f"{TEACHER}.inference.name=vllm",
               "distillation.distillation_loss.loss_mode=forward_kl_topk", f"{TEACHER}.inference.engine_kwargs.vllm.max_logprobs=64",
               f"{TEACHER}.num_replicas=2", "distillation.teacher_key=ability")
    check_config(cfg, require_data_files=False)
    notes = frozen_model_notes(cfg)
    assert len(notes) == 3
    assert notes[0].startswith(f"{RM}.rollout: name=vllm, gpu_memory_utilization=0.8 configure verl's inference server")
    assert notes[1].startswith(f"{TEACHER}: inference.name=vllm, num_replicas=2 configure verl's teacher server")
    assert notes[2].startswith("distillation.teacher_key=ability: with one teacher")
    assert frozen_model_notes(_cfg(f"{RM}.enable=true", f"{RM}.model_path=/rm", *DIST)) == []  # defaults: nothing to say


@pytest.mark.parametrize("knob", RM_SERVING_KNOBS)
def test_every_reward_model_serving_knob_is_noted(knob):
    default = getattr(RMRolloutConfig(), knob)
    value = {bool: not default, int: 7, float: 0.25, str: "vllm" if knob == "name" else "other"}.get(type(default), [1])
    cfg = _cfg(f"{RM}.enable=true", f"{RM}.model_path=/rm")
    cfg.reward.reward_model.rollout[knob] = value
    assert f"{knob}=" in frozen_model_notes(cfg)[0]
