"""Check a whole run configuration before any worker or model starts.

Each check raises :class:`~rlvr.utils.errors.ConfigError` naming the key and saying what to change.
Names that come from a registry (advantage estimator, policy loss, reward manager, rollout engine,
KL estimator, rollout-correction level) are looked up in that registry, so the error lists the
names that are valid today.

:func:`check_config` runs every check that needs no registry and imports neither torch nor Ray, so
the ``rlvr`` command reports a wrong key, value or batch size within a second or two (registry
names and what a built-in estimator needs are checked there against
:mod:`~rlvr.trainer.config.builtin_names`); :func:`validate_config` adds the registry lookups
(which import the algorithm code), what the registered estimator needs, and the reward routes.
A config that names the user's code (:func:`uses_user_code`) has its names checked against the
registries after the user's modules are imported (when the config loads), so the user's names pass
and a misspelt one still gets a suggestion.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import sys
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from rlvr.reward.config import ON_ERROR_CHOICES
from rlvr.trainer.config.algorithm_checks import check_new_algorithm_settings
from rlvr.trainer.config.async_checks import check_async_training
from rlvr.trainer.config.builtin_names import BUILTIN_ESTIMATOR_NEEDS, BUILTIN_NAMES, NULLABLE_NAMES, EstimatorNeeds
from rlvr.trainer.config.moe_checks import check_moe
from rlvr.trainer.config.schema import (AGG_LOSS_MODES, GPG_ALPHA_COUNTS, SINGLETON_CHOICES, STRATEGIES,
                                        WEIGHT_FILE_FORMATS, RlvrConfig)
from rlvr.trainer.config.suggest import did_you_mean
from rlvr.trainer.ppo.correction_thresholds import is_rs_option_list
from rlvr.trainer.config.validate_rollout_scale import check_rollout_scale
from rlvr.trainer.config.validate_models import check_distillation, check_reward_model, uses_teacher
from rlvr.trainer.config.validate_profiler import check_profiler
from rlvr.trainer.config.validate_server import check_openai_endpoint, check_rollout_server
from rlvr.trainer.config.validate_verl import check_verl_settings, rejection_band
from rlvr.utils.errors import VLLM_MISSING, ConfigError
from rlvr.utils.registry import Registry, RegistryKeyError
from rlvr.utils.user_code import is_object_path
from rlvr.workers.megatron.layout import check_megatron_config, data_parallel_size, megatron_lora

PYTHON_TOOL = "rlvr.agent.tools.python_interpreter.PythonInterpreterTool"

BACKENDS = ("ray", "local")
DEVICES = ("auto", "cpu", "cuda")
LOGGERS = {"console": None, "jsonl": None, "tensorboard": "tensorboard", "wandb": "wandb"}
RESUME_MODES = ("auto", "disable", "resume_path")
FILTER_METRICS = ("acc", "score", "reward", "seq_reward")


def world_size(cfg: DictConfig) -> int:
    """Workers per role: ``nnodes * n_gpus_per_node`` on Ray, 1 on the local backend."""
    if cfg.trainer.backend == "local":
        return 1
    return cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node


def use_reference(cfg: DictConfig) -> bool:
    """A reference policy exists only for a KL term (in the loss or in the reward)."""
    return bool(cfg.actor_rollout_ref.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward)


def reference_in_actor(cfg: DictConfig) -> bool:
    """The reference is the actor's model with its LoRA adapters off, not a model of its own: a
    reference with LoRA (the FSDP engines' ``model.lora_rank`` or Megatron's ``model.lora.rank``)."""
    return use_reference(cfg) and (cfg.actor_rollout_ref.model.lora_rank > 0 or megatron_lora(cfg))


def _require(condition: bool, key: str, message: str) -> None:
    if not condition:
        raise ConfigError(key, message)


def _check_one_of(cfg_value: Any, key: str, choices: Collection[str]) -> None:
    _require(cfg_value in choices, key, f"{cfg_value!r} is not valid{did_you_mean(cfg_value, choices)}; "
             f"use one of {', '.join(choices)}")


def check_field_choices(section: Any, schema: type, prefix: str = "") -> None:
    """Refuse a value outside the ``choices`` that a schema field's metadata lists, in ``section``
    (a config node of the dataclass ``schema``) and every dataclass section under it."""
    for spec in dataclasses.fields(schema):
        value = section.get(spec.name) if isinstance(section, (DictConfig, Mapping)) else getattr(section, spec.name, None)
        key = f"{prefix}{spec.name}"
        if "choices" in spec.metadata:
            _check_one_of(value, key, spec.metadata["choices"])
        elif spec.default_factory is not dataclasses.MISSING and value is not None:
            nested = spec.default_factory()
            if dataclasses.is_dataclass(nested):
                check_field_choices(value, type(nested), key + ".")


def _check_token_kl(cfg_value: Any, key: str) -> None:
    """A KL estimator that works on per-token log-probs (the workers send no full-vocabulary ones);
    its name is checked with the other registry names (:func:`check_names`)."""
    _require(cfg_value != "full", key, "'full' needs full-vocabulary log-probs, which the workers do not send "
             "(they send the sampled tokens' log-probs); use low_var_kl (k3) or kl (k1)")


def _paths(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, (list, tuple, ListConfig)):
        return [str(v) for v in value]
    return [str(value)]


def _check_files(key: str, value: Any, required: bool) -> None:
    files = _paths(value)
    _require(bool(files) or not required, key, "no training data given; set it to a parquet or JSONL file "
             "(e.g. make one with `python scripts/preprocess_reasoning_gym.py`)")
    for path in files:
        _require(Path(path).is_file(), key, f"data file {path!r} does not exist; check the path or "
                 "create it with scripts/preprocess_gsm8k.py / scripts/preprocess_reasoning_gym.py")
        _require(Path(path).suffix in (".parquet", ".jsonl", ".json"), key,
                 f"{path!r} is neither .parquet nor .jsonl; convert it to one of these formats")


def _check_trainer(cfg: DictConfig) -> None:
    t = cfg.trainer
    _check_one_of(t.backend, "trainer.backend", BACKENDS)
    _require(t.device != "npu", "trainer.device", "Ascend NPUs are hardware rlvr does not run on; use cuda (or cpu)")
    _check_one_of(t.device, "trainer.device", DEVICES)
    _require(t.nnodes >= 1 and t.n_gpus_per_node >= 1, "trainer.n_gpus_per_node",
             "nnodes and n_gpus_per_node must be >= 1")
    _require(t.backend == "ray" or t.nnodes * t.n_gpus_per_node == 1, "trainer.n_gpus_per_node",
             "the local backend runs one worker in the driver; set trainer.nnodes=1 trainer.n_gpus_per_node=1 "
             "or use trainer.backend=ray")
    _require(t.total_epochs >= 1, "trainer.total_epochs", "must be >= 1")
    _require(t.total_training_steps is None or t.total_training_steps >= 1, "trainer.total_training_steps",
             "must be >= 1 (or null to run total_epochs over the data)")
    _require(t.max_time_s is None or t.max_time_s > 0, "trainer.max_time_s", "must be > 0 seconds (or null)")
    _require(t.test_freq == -1 or t.test_freq > 0, "trainer.test_freq", "use -1 (only at the end) or a step count > 0")
    _require(t.save_freq == -1 or t.save_freq > 0, "trainer.save_freq", "use -1 (only at the end) or a step count > 0")
    _require(t.critic_warmup >= 0, "trainer.critic_warmup", "must be >= 0")
    _require(t.log_val_generations >= 0, "trainer.log_val_generations", "must be >= 0 (0 logs no samples)")
    _require(t.call_timeout_s > 0, "trainer.call_timeout_s", "must be > 0 seconds")
    _require(t.max_restarts >= 0, "trainer.max_restarts", "must be >= 0 (0 = stop at the first worker failure)")
    _require(t.max_actor_ckpt_to_keep is None or t.max_actor_ckpt_to_keep >= 1, "trainer.max_actor_ckpt_to_keep",
             "keep at least 1 checkpoint (or null to keep all)")
    _check_one_of(t.resume_mode, "trainer.resume_mode", RESUME_MODES)
    if t.resume_mode == "resume_path":
        _require(t.resume_from_path is not None and Path(t.resume_from_path).is_dir(), "trainer.resume_from_path",
                 f"resume_mode=resume_path needs an existing checkpoint directory, got {t.resume_from_path!r}")
    for name in t.logger:
        _require(name in LOGGERS, "trainer.logger", f"unknown logger {name!r}; use any of {', '.join(LOGGERS)}")
        module = LOGGERS[name]
        _require(module is None or importlib.util.find_spec(module) is not None, "trainer.logger",
                 f"the {name} logger needs the `{module}` package: `pip install {module}` or remove {name!r}")


def _check_data(cfg: DictConfig, require_data_files: bool) -> None:
    d = cfg.data
    _check_files("data.train_files", d.train_files, required=require_data_files)
    _check_files("data.val_files", d.val_files, required=False)
    _require(not (cfg.trainer.val_only and require_data_files and d.val_files is None), "trainer.val_only",
             "validating only needs validation data: set data.val_files (or trainer.val_only=false)")
    _require(d.train_batch_size >= 1, "data.train_batch_size", "must be >= 1 prompt")
    _require(d.max_prompt_length >= 1, "data.max_prompt_length", "must be >= 1 token")
    _require(d.max_response_length >= 1, "data.max_response_length", "must be >= 1 token")
    _require(d.val_batch_size is None or d.val_batch_size >= 1, "data.val_batch_size", "must be >= 1 (or null)")
    _check_one_of(d.truncation, "data.truncation", ("error", "left", "right"))


def _check_batch_sizes(section: DictConfig, prefix: str, cfg: DictConfig, dynamic_bsz: bool) -> None:
    """``train_batch_size`` splits into mini-batches, each of which splits over the data-parallel
    workers and micro-batches."""
    n, workers = cfg.actor_rollout_ref.rollout.n, data_parallel_size(cfg, "critic" if prefix == "critic" else "actor")
    mini, train = section.ppo_mini_batch_size, cfg.data.train_batch_size
    _require(mini >= 1, f"{prefix}.ppo_mini_batch_size", "must be >= 1 prompt")
    _require(train % mini == 0, f"{prefix}.ppo_mini_batch_size",
             f"data.train_batch_size={train} is not a multiple of ppo_mini_batch_size={mini}; "
             f"pick a mini-batch size that divides {train} (verl 0.9.1's workers assert the same when they "
             "cut a step's batch into mini-batches; its older workers ran a short last one)")
    micro = section.ppo_micro_batch_size_per_gpu
    _require(micro >= 1, f"{prefix}.ppo_micro_batch_size_per_gpu", "must be >= 1 sequence")
    sequences = mini * n
    _require(sequences % workers == 0, f"{prefix}.ppo_mini_batch_size",
             f"a mini-batch of {mini} prompts x rollout.n={n} = {sequences} sequences does not split over "
             f"{workers} workers; make ppo_mini_batch_size * rollout.n a multiple of {workers}")
    if not dynamic_bsz:
        _require((sequences // workers) % micro == 0, f"{prefix}.ppo_micro_batch_size_per_gpu",
                 f"each worker gets {sequences // workers} sequences per mini-batch (ppo_mini_batch_size={mini} "
                 f"x rollout.n={n} / {workers} workers), not a multiple of ppo_micro_batch_size_per_gpu={micro}; "
                 f"use a micro-batch size that divides {sequences // workers}")


def _check_sequence_layout(section: DictConfig, prefix: str, model: DictConfig, model_key: str, cfg: DictConfig,
                           sp_size: int) -> None:
    """Packing, Ulysses sequence parallelism and token budgets of one model (``section``: actor, ref,
    rollout or critic); the head counts are checked by :func:`check_sequence_parallel_heads`."""
    key = f"{prefix}.ulysses_sequence_parallel_size"
    _require(sp_size >= 1, key, f"must be >= 1, got {sp_size}")
    _require(sp_size == 1 or model.use_remove_padding, key,
             f"Ulysses sequence parallelism splits packed sequences; set {model_key}.use_remove_padding=true")
    _require(world_size(cfg) % sp_size == 0, key,
             f"{sp_size} sequence-parallel ranks do not divide the {world_size(cfg)} workers; use a divisor of "
             f"{world_size(cfg)} (the local backend has one worker: use trainer.backend=ray)")
    for name in ("ppo_max_token_len_per_gpu", "forward_max_token_len_per_gpu", "log_prob_max_token_len_per_gpu"):
        if name in section:
            _require(section[name] >= 1, f"{prefix}.{name}", f"the token budget must be >= 1, got {section[name]}")


def check_sequence_parallel_heads(cfg: DictConfig) -> None:
    """The attention heads of every model with Ulysses sequence parallelism split over its ranks
    (reads the models' configs, hence transformers)."""
    from rlvr.workers.ulysses import check_model_heads

    arr = cfg.actor_rollout_ref
    models = [(arr.actor.ulysses_sequence_parallel_size, arr.model, "actor_rollout_ref.actor")]
    if use_reference(cfg):
        models.append((arr.ref.ulysses_sequence_parallel_size, arr.model, "actor_rollout_ref.ref"))
    if cfg.critic.enable:
        models.append((cfg.critic.ulysses_sequence_parallel_size, cfg.critic.model, "critic"))
    for size, model, prefix in models:
        if size > 1:
            check_model_heads(model.path, size, f"{prefix}.ulysses_sequence_parallel_size", model.trust_remote_code)


def _check_strategy(value: str, key: str) -> None:
    _require(value in STRATEGIES, key, f"{value!r} is not a training backend; use one of {', '.join(STRATEGIES)} "
             "(fsdp and fsdp2 both mean PyTorch FSDP2)")


def _check_actor(cfg: DictConfig) -> None:
    actor = cfg.actor_rollout_ref.actor
    _check_strategy(actor.strategy, "actor_rollout_ref.actor.strategy")
    if cfg.actor_rollout_ref.ref.strategy is not None:
        _check_strategy(cfg.actor_rollout_ref.ref.strategy, "actor_rollout_ref.ref.strategy")
    _require(not actor.global_batch_info, "actor_rollout_ref.actor.global_batch_info",
             "is filled in by the actor worker; remove it from the config")
    _check_batch_sizes(actor, "actor_rollout_ref.actor", cfg, actor.use_dynamic_bsz)
    arr, model_key = cfg.actor_rollout_ref, "actor_rollout_ref.model"
    _check_sequence_layout(actor, "actor_rollout_ref.actor", arr.model, model_key, cfg,
                           actor.ulysses_sequence_parallel_size)
    _check_sequence_layout(arr.rollout, "actor_rollout_ref.rollout", arr.model, model_key, cfg, 1)
    _check_sequence_layout(arr.ref, "actor_rollout_ref.ref", arr.model, model_key, cfg,
                           arr.ref.ulysses_sequence_parallel_size if use_reference(cfg) else 1)
    _require(actor.ppo_epochs >= 1, "actor_rollout_ref.actor.ppo_epochs", "must be >= 1")
    _require(actor.clip_ratio > 0, "actor_rollout_ref.actor.clip_ratio", "must be > 0 (typically 0.2)")
    _require(actor.clip_ratio_c > 1, "actor_rollout_ref.actor.clip_ratio_c", "dual-clip bound must be > 1 (typically 3)")
    _require(actor.grad_clip > 0, "actor_rollout_ref.actor.grad_clip", "must be > 0")
    _require(actor.optim.lr > 0, "actor_rollout_ref.actor.optim.lr", "must be > 0")
    _check_one_of(actor.loss_agg_mode, "actor_rollout_ref.actor.loss_agg_mode", AGG_LOSS_MODES)
    _check_token_kl(actor.kl_loss_type, "actor_rollout_ref.actor.kl_loss_type")
    loss = actor.policy_loss
    for key, value in (("clip_cov_ratio", loss.clip_cov_ratio), ("kl_cov_ratio", loss.kl_cov_ratio)):
        _require(value > 0, f"actor_rollout_ref.actor.policy_loss.{key}",
                 f"must be > 0 (a fraction of the valid tokens, e.g. 0.0002), got {value}")
    _require(loss.clip_cov_lb < loss.clip_cov_ub, "actor_rollout_ref.actor.policy_loss.clip_cov_lb",
             f"clip_cov_lb={loss.clip_cov_lb} must be below clip_cov_ub={loss.clip_cov_ub}")
    _check_one_of(cfg.actor_rollout_ref.model.dtype, "actor_rollout_ref.model.dtype", ("float32", "bfloat16"))
    _require(cfg.actor_rollout_ref.model.lora_rank >= 0, "actor_rollout_ref.model.lora_rank", "must be >= 0 (0 = no LoRA)")


def _check_rollout(cfg: DictConfig) -> None:
    rollout = cfg.actor_rollout_ref.rollout
    _require(rollout.n >= 1, "actor_rollout_ref.rollout.n", "must be >= 1 sample per prompt")
    _require(not rollout.do_sample or rollout.temperature > 0, "actor_rollout_ref.rollout.temperature",
             "sampling needs temperature > 0; for greedy decoding set rollout.do_sample=False")
    _require(0 < rollout.top_p <= 1, "actor_rollout_ref.rollout.top_p", "must be in (0, 1]")
    _require(rollout.val_kwargs.n >= 1, "actor_rollout_ref.rollout.val_kwargs.n", "must be >= 1")
    _check_agent(rollout)
    check_openai_endpoint(rollout.agent, rollout.agent.default_agent_loop)
    check_rollout_server(rollout)
    _check_quantization(cfg)
    check_rollout_scale(cfg)
    if rollout.name == "vllm":
        _check_vllm(rollout)


def _check_agent(rollout: DictConfig) -> None:
    """The multi-turn settings the default agent loop needs (its name, the parser's and the
    environment's are registry names: :func:`check_names`)."""
    key = "actor_rollout_ref.rollout.multi_turn"
    loop, mt = rollout.agent.default_agent_loop, rollout.multi_turn
    _require(mt.max_tool_response_tokens >= 1, f"{key}.max_tool_response_tokens", "must be >= 1 token")
    _require(mt.max_parallel_calls >= 1, f"{key}.max_parallel_calls", "must be >= 1 call per turn")
    _require(mt.tool_timeout_s > 0, f"{key}.tool_timeout_s", "must be > 0 seconds")
    if mt.tool_config_path is not None or loop == "tool_agent":
        _require(mt.tool_config_path is not None and Path(mt.tool_config_path).is_file(), f"{key}.tool_config_path",
                 f"the tool_agent loop needs a YAML file of tools (see rlvr.agent.tools); {mt.tool_config_path!r} "
                 "is not a file")
        _check_python_tool_sandboxes(mt.tool_config_path, f"{key}.tool_config_path")
    if loop == "env_agent":
        _require(mt.env_name is not None, f"{key}.env_name",
                 "the env_agent loop needs an environment: set it to a registered one (built in: retry; "
                 "add one with rlvr.agent.register_environment)")


def _check_quantization(cfg: DictConfig) -> None:
    """``rollout.quantization``: fp8 or off; the hf engine quantises plain linear layers (no LoRA)."""
    key, rollout = "actor_rollout_ref.rollout.quantization", cfg.actor_rollout_ref.rollout
    _require(rollout.quantization in (None, "fp8"), key,
             f"{rollout.quantization!r} is not valid; use fp8 or null (off)")
    _require(not (rollout.quantization and rollout.name == "hf" and cfg.actor_rollout_ref.model.lora_rank > 0), key,
             "the hf engine's fp8 rollout quantises the model's plain linear layers and cannot hold LoRA adapters "
             "(model.lora_rank > 0); train without LoRA or set rollout.quantization=null")


def _check_vllm(rollout: DictConfig) -> None:
    """vLLM must be importable (its own venv: it pins its own torch and transformers), unless it runs
    as servers (``rollout.mode=async``: checked by :func:`check_rollout_server`)."""
    key = "actor_rollout_ref.rollout"
    _require(rollout.mode == "async" or importlib.util.find_spec("vllm") is not None, f"{key}.name", VLLM_MISSING)
    truncated = rollout.do_sample and (rollout.top_p < 1 or rollout.top_k > 0)
    _require(not truncated, f"{key}.top_p" if rollout.top_p < 1 else f"{key}.top_k",
             f"rollout.name=vllm cannot sample with top_p={rollout.top_p} / top_k={rollout.top_k}: vLLM then "
             "reports each token's log-prob renormalised over the kept tokens, not under the full distribution "
             "the actor scores, so the rollout/actor mismatch metrics and algorithm.rollout_correction would "
             f"measure the truncation instead of the engine's error; set {key}.top_p=1.0 and {key}.top_k=-1, or "
             "use rollout.name=hf (its log-probs are of the full distribution)")
    _require(rollout.dtype in (None, "float32", "bfloat16"), f"{key}.dtype",
             f"{rollout.dtype!r} is not valid; use float32, bfloat16 or null (= model.dtype)")
    _require(0 < rollout.gpu_memory_utilization <= 1, f"{key}.gpu_memory_utilization", "must be in (0, 1]")
    _require(rollout.kv_cache_memory_bytes is None or rollout.kv_cache_memory_bytes > 0,
             f"{key}.kv_cache_memory_bytes", "must be > 0 bytes (or null)")
    _require(rollout.max_num_seqs >= 1, f"{key}.max_num_seqs", "must be >= 1")
    _check_one_of(rollout.load_format, f"{key}.load_format", ("dummy",) + WEIGHT_FILE_FORMATS)


def _check_estimator_needs(cfg: DictConfig, needs: EstimatorNeeds) -> None:
    """What the estimator's registry entry says it needs: groups (``n > 1``), a critic."""
    algo, n = cfg.algorithm, cfg.actor_rollout_ref.rollout.n
    _require(not needs.needs_groups or n > 1, "actor_rollout_ref.rollout.n",
             f"algorithm.adv_estimator={algo.adv_estimator} compares the samples of one prompt, so it needs "
             f"rollout.n > 1 (got {n}); set actor_rollout_ref.rollout.n=8 for example")
    _require(not needs.needs_critic or cfg.critic.enable, "critic.enable",
             f"algorithm.adv_estimator={algo.adv_estimator} needs a critic; set critic.enable=True or pick a "
             "critic-free estimator such as grpo or rloo")


def _check_algorithm(cfg: DictConfig, needs: EstimatorNeeds | None) -> None:
    algo, n = cfg.algorithm, cfg.actor_rollout_ref.rollout.n
    if needs is not None:
        _check_estimator_needs(cfg, needs)
    _require(algo.singleton_advantage is None or algo.singleton_advantage in SINGLETON_CHOICES,
             "algorithm.singleton_advantage", f"{algo.singleton_advantage!r} is not valid; use score, zero or null")
    _check_one_of(algo.gpg_alpha_count, "algorithm.gpg_alpha_count", GPG_ALPHA_COUNTS)
    _check_one_of(algo.egpo_uncertainty_norm, "algorithm.egpo_uncertainty_norm", ("group", "batch"))
    _require(0 <= algo.egpo_alpha <= 1, "algorithm.egpo_alpha", f"must be in [0, 1], got {algo.egpo_alpha}")
    _require(algo.egpo_beta >= 0, "algorithm.egpo_beta", f"must be >= 0, got {algo.egpo_beta}")
    _check_token_kl(algo.kl_penalty, "algorithm.kl_penalty")
    _check_one_of(algo.kl_ctrl.type, "algorithm.kl_ctrl.type", ("fixed", "adaptive"))
    if algo.kl_ctrl.type == "adaptive":
        _require(algo.kl_ctrl.target_kl > 0 and algo.kl_ctrl.horizon > 0, "algorithm.kl_ctrl",
                 "the adaptive KL controller needs target_kl > 0 and horizon > 0")
    _require(0 <= algo.gamma <= 1 and 0 <= algo.lam <= 1, "algorithm.gamma", "gamma and lam must be in [0, 1]")
    fg = algo.filter_groups
    _check_one_of(fg.metric, "algorithm.filter_groups.metric", FILTER_METRICS)
    _require(fg.max_num_gen_batches >= 0, "algorithm.filter_groups.max_num_gen_batches", "must be >= 0 (0 = unlimited)")
    _require(not fg.enable or n > 1, "algorithm.filter_groups.enable",
             "dynamic sampling drops groups whose samples agree, which needs rollout.n > 1")
    _check_rollout_correction(algo.rollout_correction)


def _check_rollout_correction(rc: DictConfig) -> None:
    key = "algorithm.rollout_correction"
    band = rejection_band(rc) if rc.rollout_rs is not None else None
    if band is not None:
        lower, upper = band
        _require(0 < lower < upper, f"{key}.rollout_rs_threshold",
                 f"the rejection band [{lower}, {upper}] needs 0 < lower < upper (e.g. 0.5 and 2.0)")
    _require(rc.log_prob_diff_threshold >= 0, f"{key}.log_prob_diff_threshold", "must be >= 0")


def _check_critic(cfg: DictConfig) -> None:
    if not cfg.critic.enable:
        return
    _check_strategy(cfg.critic.strategy, "critic.strategy")
    _check_batch_sizes(cfg.critic, "critic", cfg, dynamic_bsz=cfg.critic.use_dynamic_bsz)
    _check_sequence_layout(cfg.critic, "critic", cfg.critic.model, "critic.model", cfg,
                           cfg.critic.ulysses_sequence_parallel_size)
    _require(cfg.critic.optim.lr > 0, "critic.optim.lr", "must be > 0")
    _require(cfg.critic.cliprange_value > 0, "critic.cliprange_value", "must be > 0")
    _check_one_of(cfg.critic.loss_agg_mode, "critic.loss_agg_mode", AGG_LOSS_MODES)


def _check_reward(cfg: DictConfig) -> None:
    rm = cfg.reward_model
    if rm.on_error is not None:  # None: the reward manager's own default
        _check_one_of(rm.on_error, "reward_model.on_error", ON_ERROR_CHOICES)
    _require(rm.timeout_s > 0, "reward_model.timeout_s", "must be > 0 seconds")
    buffer, max_len = rm.overlong_buffer, cfg.data.max_response_length
    _require(not buffer.enable or 0 < buffer.len <= max_len, "reward_model.overlong_buffer.len",
             f"the overlong buffer must fit in the response: use a length in (0, data.max_response_length={max_len}], "
             f"got {buffer.len}")
    custom = cfg.custom_reward_function
    _require(custom.path is None or Path(custom.path).is_file(), "custom_reward_function.path",
             f"file {custom.path!r} does not exist; give the path of a .py file defining {custom.name}()")
    _check_code_sandbox(cfg)


def _check_code_sandbox(cfg: DictConfig) -> None:
    """A routed ``code_sandbox`` reward worker without ``sandbox_url`` runs programs in the local
    sandbox: start it now (it probes the kernel's isolation and an interpreter the sandbox can run,
    once per process), so that a sandbox that cannot work is a config error, not a failure at the
    first reward."""
    if "code_sandbox" not in cfg.reward.routes.values():
        return
    section = cfg.reward.workers.code_sandbox
    if section.sandbox_url:
        return
    _start_local_sandbox(OmegaConf.to_object(section.sandbox), "reward.workers.code_sandbox.sandbox")


def _check_python_tool_sandboxes(path: str, key: str) -> None:
    """Start the local sandbox of each python interpreter tool that the tools file ``path`` lists,
    as :func:`_check_code_sandbox` does for the code reward: a sandbox that cannot work here is a
    config error now, not a failure when the rollout workers load the tools. The other entries,
    and the file's format, are checked when the tools load (that imports torch)."""
    import yaml

    from rlvr.sandbox.config import sandbox_config

    content = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    specs = content.get("tools") if isinstance(content, dict) else None
    for index, spec in enumerate(specs if isinstance(specs, list) else []):
        if not (isinstance(spec, dict) and spec.get("class_name") == PYTHON_TOOL):
            continue
        entry = f"tools[{index}] of {path} (the python interpreter tool)"
        try:
            _start_local_sandbox(sandbox_config(spec.get("config") or {}, "config"), "config")
        except ConfigError as err:
            raise ConfigError(key, f"{entry}: {err.key}: {err.message}") from None


def _start_local_sandbox(config: Any, at: str) -> None:
    """Start a local sandbox with ``config`` (a ``SandboxConfig``) the way the run will: it probes
    the kernel's isolation and an interpreter the sandbox can run (once per process). Its
    :class:`ConfigError`, keyed ``sandbox[.<field>]``, is raised again keyed ``at[.<field>]``, where
    ``at`` is the config path that holds those fields."""
    from rlvr.sandbox.local import LocalSandbox

    try:
        LocalSandbox(config)
    except ConfigError as err:
        raise ConfigError(at + err.key.removeprefix("sandbox"), err.message) from None


def _check_partial_rollout_engine(cfg: DictConfig) -> None:
    """A partial rollout interrupts the engine at a weight update: the engine must say it can be."""
    from rlvr.workers.rollout import get_rollout_engine

    name = cfg.actor_rollout_ref.rollout.name
    _require(not cfg.async_training.partial_rollout or get_rollout_engine(name).interruptible,
             "async_training.partial_rollout",
             f"the rollout engine {name!r} cannot be interrupted in the middle of a generation (its factory says "
             "interruptible=False), so it cannot run partial rollouts; use rollout.name=hf or partial_rollout=false")


REGISTRIES = {
    "algorithm.adv_estimator": ("rlvr.trainer.ppo.advantage", "ADV_ESTIMATOR_REGISTRY"),
    "actor_rollout_ref.actor.policy_loss.loss_mode": ("rlvr.trainer.ppo.policy_loss", "POLICY_LOSS_REGISTRY"),
    "actor_rollout_ref.rollout.name": ("rlvr.workers.rollout.base", "ROLLOUT_ENGINES"),
    "reward_model.reward_manager": ("rlvr.reward.managers.registry", "REWARD_MANAGER_REGISTRY"),
    "actor_rollout_ref.actor.kl_loss_type": ("rlvr.trainer.ppo.kl", "TOKEN_KL_PENALTY_NAMES"),
    "algorithm.kl_penalty": ("rlvr.trainer.ppo.kl", "TOKEN_KL_PENALTY_NAMES"),
    "algorithm.rollout_correction.rollout_is": ("rlvr.trainer.ppo.rollout_correction", "ROLLOUT_RATIO_LEVELS"),
    "algorithm.rollout_correction.rollout_rs": ("rlvr.trainer.ppo.rollout_correction", "ROLLOUT_RATIO_LEVELS"),
    "actor_rollout_ref.rollout.agent.default_agent_loop": ("rlvr.agent.loop", "AGENT_LOOPS"),
    "actor_rollout_ref.rollout.multi_turn.format": ("rlvr.agent.tool_parser", "TOOL_PARSERS"),
    "actor_rollout_ref.rollout.multi_turn.env_name": ("rlvr.agent.env_agent", "ENVIRONMENTS"),
    "distillation.distillation_loss.loss_mode": ("rlvr.trainer.ppo.distillation", "DISTILLATION_LOSS_REGISTRY"),
}
"""Config key -> ``(module, attribute)`` of the registry behind it (the KL estimators are a plain
set of names)."""


def registered_names() -> dict[str, Collection[str]]:
    """Config key -> the registry behind it, as it is now (imports the registries, hence torch)."""
    import rlvr.agent  # noqa: F401 - the agent package registers its loops, parsers and environments

    return {key: vars(importlib.import_module(module))[attribute] for key, (module, attribute) in REGISTRIES.items()}


def registered_in_process() -> bool:
    """Whether this process registered names of its own before the run, without the config naming
    any code: a registry already imported here holds a name that is not built in (a launcher script
    that imports its extensions, or defines them, and then calls ``main``). Imports nothing."""
    for key, (module, attribute) in REGISTRIES.items():
        loaded = sys.modules.get(module)
        if loaded is not None and attribute in vars(loaded) and set(vars(loaded)[attribute]) - set(BUILTIN_NAMES[key]):
            return True
    return False


def check_names(cfg: DictConfig, names: Mapping[str, Collection[str]]) -> None:
    """Each registry-backed value of ``cfg`` is one of ``names[key]``: a registry (see
    :func:`registered_names`; an object path ``pkg.module:Name`` is loaded and must give an entry)
    or a collection of names (:data:`~rlvr.trainer.config.builtin_names.BUILTIN_NAMES`). The keys of
    :data:`~rlvr.trainer.config.builtin_names.NULLABLE_NAMES` may also be null (off)."""
    for key, valid in names.items():
        value = OmegaConf.select(cfg, key)
        if value is None and key in NULLABLE_NAMES:
            continue
        if key == "algorithm.rollout_correction.rollout_rs" and is_rs_option_list(value):
            continue  # verl's rejection options (token_k1, seq_mean_k3, ...), not a ratio level
        if isinstance(valid, Registry) and is_object_path(value):
            try:
                valid[value]
            except RegistryKeyError as err:
                raise ConfigError(key, str(err)) from None
            continue
        choices = sorted(valid)
        _require(value in valid, key, f"{value!r} is not valid{did_you_mean(value, choices)}; "
                 f"use one of {', '.join(choices)}")


def uses_user_code(cfg: DictConfig) -> bool:
    """Whether the run uses code of the user's: the config names modules to import
    (``trainer.user_modules``, verl's ``model.external_lib``) or an object path where a registry name
    goes, or this process registered names of its own before (:func:`registered_in_process`). Then
    the registry-backed values are checked against the registries (which hold the user's names), not
    against the built-in names."""
    from rlvr.trainer.user_code import user_module_entries

    values = [OmegaConf.select(cfg, key) for key in BUILTIN_NAMES] + [
        part.rpartition("*")[2].strip() for target in cfg.reward.routes.values() for part in str(target).split("+")]
    return bool(user_module_entries(cfg)) or any(is_object_path(value) for value in values) or registered_in_process()


def check_config(cfg: DictConfig, require_data_files: bool = True, estimator_needs: EstimatorNeeds | None = None
                 ) -> None:
    """Every check of :func:`validate_config` that needs no registry; imports neither torch nor Ray.

    ``estimator_needs`` is what the estimator's registry entry says it needs; without it a built-in
    estimator's needs come from :data:`~rlvr.trainer.config.builtin_names.BUILTIN_ESTIMATOR_NEEDS`
    (another estimator's are checked by :func:`validate_config`)."""
    needs = estimator_needs or BUILTIN_ESTIMATOR_NEEDS.get(cfg.algorithm.adv_estimator)
    check_field_choices(cfg, RlvrConfig)
    _check_trainer(cfg)
    check_verl_settings(cfg)
    _check_data(cfg, require_data_files)
    _check_rollout(cfg)
    _check_algorithm(cfg, needs)
    check_new_algorithm_settings(cfg, needs)
    check_async_training(cfg, needs is not None and needs.needs_greedy_baseline,
                         needs is not None and needs.reads_old_log_prob)
    _check_actor(cfg)
    _check_critic(cfg)
    check_moe(cfg)
    roles = ["actor", *(["ref"] if use_reference(cfg) and not reference_in_actor(cfg) else []),
             *(["critic"] if cfg.critic.enable else [])]
    check_megatron_config(cfg, roles)
    _check_reward(cfg)
    check_reward_model(cfg)
    check_distillation(cfg)
    check_profiler(cfg)


def validate_config(cfg: DictConfig, require_data_files: bool = True) -> None:
    """Raise :class:`ConfigError` for the first problem found in ``cfg`` (a finalised config).

    ``require_data_files=False`` accepts a config without ``data.train_files`` (the caller passes
    a dataset object); files that are named must still exist.

    Checked: backend/device/loggers, data files, batch-size divisibility for actor and critic,
    packing / sequence parallelism / token budgets and the models' head counts under sequence
    parallelism, registry names (estimator, policy loss, reward manager, rollout engine, KL estimators,
    rollout-correction levels, agent loop, tool-call parser, environment), the tools file of tool_agent,
    what the estimator's registry entry needs (groups: ``n > 1``; a
    critic: ``critic.enable``), loss and estimator knobs, reward routes (their names, and a route for
    every domain in the data files), strategy and hybrid engine, resume settings, dynamic sampling,
    and that a CUDA device is visible when ``trainer.device=cuda``.
    """
    from rlvr.reward.routing import check_reward_routes
    from rlvr.trainer.ppo.advantage import get_adv_estimator_needs

    names = registered_names()
    check_names(cfg, {"algorithm.adv_estimator": names["algorithm.adv_estimator"]})
    check_config(cfg, require_data_files, get_adv_estimator_needs(cfg.algorithm.adv_estimator))
    check_names(cfg, names)
    check_reward_routes(cfg)
    check_sequence_parallel_heads(cfg)
    if uses_teacher(cfg):
        from rlvr.workers.teacher import check_teacher_tokenizer

        check_teacher_tokenizer(cfg)
    if cfg.reward.reward_model.enable:
        from rlvr.workers.models import check_sequence_classifier

        check_sequence_classifier(cfg.reward.reward_model.model_path, cfg.reward.reward_model.trust_remote_code)
    _check_partial_rollout_engine(cfg)
    if cfg.trainer.device == "cuda":
        import torch

        _require(torch.cuda.is_available(), "trainer.device", "cuda was asked for but no CUDA device is "
                 "visible; set trainer.device=cpu (or auto)")
