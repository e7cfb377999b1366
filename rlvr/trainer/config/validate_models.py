"""Checks of the frozen scoring models of a run: the discriminative reward model
(``reward.reward_model``) and the distillation teacher (``distillation``), and the start-up notes
for the verl serving knobs they accept without effect.

Torch-free, like the rest of :func:`~rlvr.trainer.config.validate.check_config`; the tokenizer
comparison of teacher and student (which loads both) is
:func:`rlvr.workers.teacher.check_teacher_tokenizer`, run by
:func:`~rlvr.trainer.config.validate.validate_config` and again by the teacher worker.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from rlvr.reward.rm_config import RM_ENGINE_NAMES, RMRolloutConfig, SandboxFusionConfig, rm_max_length
from rlvr.reward.route_spec import RM_ROUTE, parse_route
from rlvr.trainer.ppo.distillation_config import (
    TEACHER_ENGINE_NAMES,
    TOPK_LOSS_MODES,
    DistillationConfig,
    TeacherInferenceConfig,
    TeacherModelConfig,
    teacher_config,
)
from rlvr.utils.errors import ConfigError

__all__ = ["check_reward_model", "check_distillation", "frozen_model_notes", "uses_reward_model", "uses_teacher",
           "RM_SERVING_KNOBS", "TEACHER_SERVING_KNOBS"]

DTYPES = ("float32", "bfloat16")
RM_KEY = "reward.reward_model"
TEACHER_KEY = "distillation.teacher_models.teacher_model"


def _require(condition: bool, key: str, message: str) -> None:
    if not condition:
        raise ConfigError(key, message)


def uses_reward_model(cfg: DictConfig) -> bool:
    """Whether the run scores with the discriminative reward model."""
    return bool(cfg.reward.reward_model.enable)


def uses_teacher(cfg: DictConfig) -> bool:
    """Whether the run distils a teacher."""
    return bool(cfg.distillation.enabled)


def _check_pool(section: Any, key: str, own_pool: bool, cfg: DictConfig) -> None:
    if not own_pool:
        return
    size = section.nnodes * section.n_gpus_per_node
    _require(size >= 1, f"{key}.nnodes", f"its own pool has nnodes x n_gpus_per_node = {size} workers; set both "
             ">= 1, or run it colocated with the actor")
    _require(cfg.trainer.backend == "ray" or (section.nnodes, section.n_gpus_per_node) == (1, 1), f"{key}.nnodes",
             "the local backend runs one worker per pool; set nnodes=1 and n_gpus_per_node=1, or use trainer.backend=ray")


def _check_engine_knobs(rollout: DictConfig, key: str) -> None:
    """The serving keys that would change a frozen model's output must keep their defaults."""
    _require(not rollout.engine_kwargs, f"{key}.engine_kwargs", "rlvr scores with its frozen-model worker and "
             "starts no inference server for this model, so engine arguments would configure nothing; remove them")
    _require(rollout.limit_images is None, f"{key}.limit_images", "rlvr's frozen scoring models read text only; "
             "remove the key")
    _require(rollout.dtype in DTYPES, f"{key}.dtype", f"{rollout.dtype!r} is not a dtype; use one of {', '.join(DTYPES)}")


def check_reward_model(cfg: DictConfig) -> None:
    """``reward.reward_model`` (after the legacy keys were mapped onto it) and its place in the routing."""
    rm, routed = cfg.reward.reward_model, any(RM_ROUTE in _route_names(t) for t in cfg.reward.routes.values())
    _require(cfg.reward.sandbox_fusion.url is None, "reward.sandbox_fusion.url",
             "rlvr's code sandbox speaks its own protocol, not SandboxFusion's; route code samples to the "
             "code_sandbox reward worker (reward.routes.<domain>=code_sandbox, reward.workers.code_sandbox.sandbox_url "
             "for a remote rlvr.sandbox.http service)")
    if not rm.enable:
        _require(not routed, "reward.routes", f"a route names {RM_ROUTE!r} but the reward model is off; set "
                 f"{RM_KEY}.enable=true and {RM_KEY}.model_path")
        return
    _require(rm.model_path is not None, f"{RM_KEY}.model_path", "the reward model is enabled but has no model; set "
             f"{RM_KEY}.model_path (or reward_model.model.path) to a *ForSequenceClassification checkpoint")
    rollout = rm.rollout
    _require(rollout.name in RM_ENGINE_NAMES, f"{RM_KEY}.rollout.name",
             f"{rollout.name!r} is not an engine rlvr accepts for a reward model; use one of {', '.join(RM_ENGINE_NAMES)}")
    _check_engine_knobs(rollout, f"{RM_KEY}.rollout")
    _require(not rollout.skip_tokenizer_init, f"{RM_KEY}.rollout.skip_tokenizer_init",
             "the reward model tokenizes its chat-templated input; set it to false (verl asserts the same)")
    for name, value in (("quantization", rollout.quantization), ("mtp", rollout.mtp),
                        ("quantization_config_file", rollout.quantization_config_file)):
        _require(value is None, f"{RM_KEY}.rollout.{name}", "would change the reward model's scores and rlvr "
                 "scores with the weights as stored; remove the key")
    _require(not rollout.disaggregation.get("enabled", False), f"{RM_KEY}.rollout.disaggregation.enabled",
             "prefill/decode disaggregation is a generation server's layout; a reward model only reads; set it false")
    _require(rm_max_length(rm) >= 2, f"{RM_KEY}.rollout.max_model_len", "the longest input must be >= 2 tokens")
    _require(rm.micro_batch_size_per_gpu >= 1, f"{RM_KEY}.micro_batch_size_per_gpu", "must be >= 1 sequence")
    _require(rm.forward_max_token_len_per_gpu >= 1, f"{RM_KEY}.forward_max_token_len_per_gpu", "must be >= 1 token")
    _check_pool(rm, RM_KEY, rm.enable_resource_pool, cfg)
    if cfg.reward.routes:
        _require(routed, "reward.routes", f"the reward model is enabled but no route names {RM_ROUTE!r}; route a "
                 f"domain to it (e.g. reward.routes.<domain>={RM_ROUTE} or '{RM_ROUTE}+0*naive'), or set "
                 f"{RM_KEY}.enable=false")
    else:
        _require(cfg.reward_model.reward_manager == "naive", "reward_model.reward_manager",
                 f"the reward model alone scores every sample (no reward.routes), so the reward manager "
                 f"{cfg.reward_model.reward_manager!r} would score nothing; combine them with a route, e.g. "
                 f"reward.routes.<domain>='{RM_ROUTE}+{cfg.reward_model.reward_manager}', or leave the manager at naive")
        _require(cfg.custom_reward_function.path is None, "custom_reward_function.path",
                 "with the reward model enabled and a custom reward function, verl hands the function the address of "
                 "a reward-model server (its generative-RM pattern); rlvr's reward model is a frozen classifier "
                 "worker with no server. Use the llm_judge reward worker for a generative judge, or combine the "
                 f"function with the reward model in reward.routes (e.g. reward.routes.<domain>='{RM_ROUTE}+naive')")


def _route_names(target: str) -> list[str]:
    """The names in a route target (``a+0.5*b`` -> ``[a, b]``); a malformed one is a ConfigError."""
    try:
        return [term.name for term in parse_route(target)]
    except ValueError as err:
        raise ConfigError("reward.routes", str(err)) from None


def _check_topk_layout(cfg: DictConfig, loss: DictConfig) -> None:
    actor, model = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.model
    key = "distillation.distillation_loss.loss_mode"
    _require(loss.topk is not None and loss.topk >= 1, "distillation.distillation_loss.topk",
             f"forward_kl_topk needs the number of teacher tokens per position (>= 1), got {loss.topk}")
    _require(not model.use_remove_padding and actor.ulysses_sequence_parallel_size == 1, key,
             "forward_kl_topk runs on unpacked micro-batches; set actor_rollout_ref.model.use_remove_padding=false "
             "(and ulysses_sequence_parallel_size=1), or use a KL estimator (k3), which packs")


def check_distillation(cfg: DictConfig) -> None:
    """``distillation``: loss mode and its settings, the one teacher, its pool and engine knobs."""
    dist = cfg.distillation
    if not dist.enabled:
        return
    loss = dist.distillation_loss  # its name is checked with the other registry names
    _require(cfg.actor_rollout_ref.actor.strategy != "megatron", "distillation.enabled",
             "on-policy distillation runs with the FSDP actor (the Megatron actor does not take the teacher's "
             "scores yet); set actor_rollout_ref.actor.strategy=fsdp2 or distillation.enabled=false")
    if loss.loss_mode in TOPK_LOSS_MODES:
        _check_topk_layout(cfg, loss)
    _require(loss.use_policy_gradient or loss.loss_mode not in ("k1", "kl"), "distillation.distillation_loss.loss_mode",
             "k1's gradient with respect to the student does not depend on the teacher, so backpropagating it "
             "directly teaches nothing; use k3 (or forward_kl_topk), or use_policy_gradient=true")
    _require(loss.policy_loss_mode == "vanilla", "distillation.distillation_loss.policy_loss_mode",
             f"only vanilla is supported with use_policy_gradient (as in verl), got {loss.policy_loss_mode!r}")
    _require(loss.loss_max_clamp is None or loss.loss_max_clamp > 0, "distillation.distillation_loss.loss_max_clamp",
             "must be > 0 (or null for no clamp)")
    _require(loss.distillation_loss_coef >= 0, "distillation.distillation_loss.distillation_loss_coef", "must be >= 0")
    names = sorted(dist.teacher_models)
    _require(names == ["teacher_model"], "distillation.teacher_models",
             f"rlvr distils one teacher, under the entry teacher_model; got entries {names}. Keep one teacher "
             "(several teachers routed by distillation.teacher_key are not supported)")
    teacher = teacher_config(cfg)
    _require(teacher.model_path is not None, f"{TEACHER_KEY}.model_path",
             "distillation is enabled but the teacher has no model; set it (a folder, GGUF, hub id or alias)")
    inference = teacher.inference
    _require(inference.name in TEACHER_ENGINE_NAMES, f"{TEACHER_KEY}.inference.name",
             f"{inference.name!r} is not an engine rlvr accepts for a teacher; use one of {', '.join(TEACHER_ENGINE_NAMES)}")
    _check_teacher_engine_kwargs(inference, loss)
    _require(inference.limit_images is None, f"{TEACHER_KEY}.inference.limit_images",
             "rlvr's teacher scores text only; remove the key")
    _require(inference.dtype in DTYPES, f"{TEACHER_KEY}.inference.dtype",
             f"{inference.dtype!r} is not a dtype; use one of {', '.join(DTYPES)}")
    needed = cfg.data.max_prompt_length + cfg.data.max_response_length + 1
    _require(inference.max_model_len is None or inference.max_model_len >= needed, f"{TEACHER_KEY}.inference.max_model_len",
             f"the teacher reads the prompt, the whole response and one more position: {needed} tokens "
             f"(data.max_prompt_length + data.max_response_length + 1), more than max_model_len={inference.max_model_len}")
    _require(teacher.log_prob_micro_batch_size_per_gpu >= 1, f"{TEACHER_KEY}.log_prob_micro_batch_size_per_gpu",
             "must be >= 1 sequence")
    _require(teacher.max_token_len_per_gpu >= 1, f"{TEACHER_KEY}.max_token_len_per_gpu", "must be >= 1 token")
    _check_pool(dist, "distillation", dist.nnodes > 0, cfg)


def _check_teacher_engine_kwargs(inference: DictConfig, loss: DictConfig) -> None:
    """verl's one meaningful engine argument, ``vllm.max_logprobs``, must cover ``topk``; others are refused."""
    kwargs = {name: dict(value or {}) for name, value in inference.engine_kwargs.items()}
    vllm = kwargs.pop("vllm", {})
    max_logprobs = vllm.pop("max_logprobs", None)
    _require(not vllm and not any(kwargs.values()), f"{TEACHER_KEY}.inference.engine_kwargs",
             "rlvr computes teacher log-probs with its frozen-model worker and starts no server, so engine arguments "
             "would configure nothing; remove them (vllm.max_logprobs alone is checked against topk)")
    _require(max_logprobs is None or loss.loss_mode not in TOPK_LOSS_MODES or max_logprobs >= loss.topk,
             f"{TEACHER_KEY}.inference.engine_kwargs.vllm.max_logprobs",
             f"must be >= distillation_loss.topk={loss.topk} (verl checks the same)")


RM_SERVING_KNOBS = ("name", "gpu_memory_utilization", "enforce_eager", "cudagraph_capture_sizes", "free_cache_engine",
                    "data_parallel_size", "expert_parallel_size", "tensor_model_parallel_size",
                    "pipeline_model_parallel_size", "max_num_batched_tokens", "max_num_seqs", "load_format",
                    "layered_summon", "scheduling_policy", "full_determinism", "seed", "multi_stage_wake_up",
                    "enable_chunked_prefill", "enable_prefix_caching", "disable_log_stats", "ignore_eos", "temperature",
                    "top_k", "top_p", "do_sample", "n")
"""Keys of ``reward.reward_model.rollout`` that configure verl's inference server and sampling:
accepted, without effect on rlvr's frozen-model worker (the same score), with a start-up note."""
TEACHER_SERVING_KNOBS = ("name", "gpu_memory_utilization", "enforce_eager", "cudagraph_capture_sizes",
                         "free_cache_engine", "data_parallel_size", "expert_parallel_size", "tensor_model_parallel_size",
                         "max_num_batched_tokens", "max_num_seqs", "load_format", "enable_chunked_prefill",
                         "enable_prefix_caching", "disable_log_stats", "skip_tokenizer_init", "temperature")
"""The same for the teacher's ``inference`` section (and ``num_replicas`` of the teacher)."""


def _changed(section: Any, defaults: Any, names: tuple[str, ...]) -> list[str]:
    return [name for name in names if section[name] != getattr(defaults, name)]


def frozen_model_notes(cfg: DictConfig) -> list[str]:
    """One start-up line per frozen model whose verl serving settings are set away from their
    defaults: accepted, and without effect here (rlvr scores with its frozen-model worker)."""
    notes = []
    sandbox = cfg.reward.sandbox_fusion
    changed = _changed(sandbox, SandboxFusionConfig(), ("max_concurrent", "memory_limit_mb"))
    if changed:
        notes.append(f"reward.sandbox_fusion: {', '.join(changed)} apply to a SandboxFusion url only, which rlvr does "
                     "not use (reward.workers.code_sandbox has the code sandbox's limits), so they have no effect")
    rm = cfg.reward.reward_model
    changed = _changed(rm.rollout, RMRolloutConfig(), RM_SERVING_KNOBS) if rm.enable else []
    if changed:
        notes.append(f"{RM_KEY}.rollout: {', '.join(f'{k}={rm.rollout[k]}' for k in changed)} configure verl's "
                     "inference server; rlvr scores the discriminative reward model with its frozen-model worker (the "
                     "same score, the classifier at the last token), so they have no effect")
    dist = cfg.distillation
    if not dist.enabled:
        return notes
    teacher = teacher_config(cfg)
    changed = [f"inference.{k}={teacher.inference[k]}" for k in _changed(teacher.inference, TeacherInferenceConfig(),
                                                                         TEACHER_SERVING_KNOBS)]
    changed += [f"num_replicas={teacher.num_replicas}"] if teacher.num_replicas != TeacherModelConfig().num_replicas else []
    if changed:
        notes.append(f"{TEACHER_KEY}: {', '.join(changed)} configure verl's teacher server; rlvr computes the "
                     "teacher's log-probs with its frozen-model worker (the same log-probs, in inference.dtype), so "
                     "they have no effect")
    if dist.teacher_key != DistillationConfig().teacher_key:
        notes.append(f"distillation.teacher_key={dist.teacher_key}: with one teacher every sample goes to it (as in "
                     "verl), so the routing key has no effect")
    return notes
