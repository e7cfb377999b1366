"""Checks of the settings rlvr took over from verl 0.9's config (imports neither torch nor Ray):
micro-batch sizes, optimizer and schedule, mixed precision, checkpoint contents, data options,
rollout options, turn limits and the rollout-correction forms. Each error names the key and what to
change (see :func:`~rlvr.trainer.config.validate.check_config`, which runs :func:`check_verl_settings`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from rlvr.trainer.config.schema_sections import CHECKPOINT_CONTENTS, CHECKPOINT_ENGINE_BACKENDS
from rlvr.trainer.ppo.correction_thresholds import is_rs_option_list, is_threshold_bounds, parse_rs_thresholds
from rlvr.utils.errors import ConfigError

LR_SCHEDULES = ("constant", "cosine")
LR_DECAY_STYLES = ("constant", "linear", "cosine", "inverse-square-root", "WSD")
WSD_DECAY_STYLES = ("linear", "cosine", "exponential", "minus_sqrt")
DTYPES = ("fp32", "float32", "bf16", "bfloat16")
TRUNCATE_SIDES = ("left", "middle", "right")
CORRECTION_LOSSES = ("ppo_clip", "reinforce")
SCHEDULING = ("fcfs", "priority")
_ROLES = {"actor_rollout_ref.actor": "actor", "critic": "critic"}


def _require(condition: bool, key: str, message: str) -> None:
    if not condition:
        raise ConfigError(key, message)


def parse_threshold(value: Any, key: str) -> tuple[float | None, float]:
    """A rollout-correction threshold as ``(lower, upper)``: a number (or a number string) is an
    upper bound (lower None), verl's ``"lower_upper"`` string both (IcePop's band).

    Raises:
        ConfigError: anything else, or a band with ``lower > upper`` or a bound <= 0.
    """
    try:
        return is_threshold_bounds(value)
    except ValueError as err:
        raise ConfigError(key, str(err)) from None


def rejection_band(rc: Any) -> tuple[float, float] | None:
    """``(lower, upper)`` of the rejection (masked IS) band of ``algorithm.rollout_correction``:
    ``rollout_rs_threshold`` (None: ``rollout_is_threshold``'s upper bound), a ``lower_upper`` string
    giving both; else the lower bound is ``rollout_rs_threshold_lower`` (None: 1 / upper). With
    verl's rejection options (``token_k1``, ...) their thresholds are checked, and None is returned
    (each option has its own band or bound)."""
    key = "algorithm.rollout_correction.rollout_rs_threshold"
    if is_rs_option_list(rc.rollout_rs):
        spec = rc.rollout_rs_threshold
        try:
            parse_rs_thresholds(rc.rollout_rs, parse_threshold(rc.rollout_is_threshold, key)[1] if spec is None
                                else spec)
        except ValueError as err:
            raise ConfigError(key, str(err)) from None
        return None
    lower, upper = parse_threshold(rc.rollout_rs_threshold, key) if rc.rollout_rs_threshold is not None else (
        None, parse_threshold(rc.rollout_is_threshold, "algorithm.rollout_correction.rollout_is_threshold")[1])
    if lower is None:
        lower = 1.0 / upper if rc.rollout_rs_threshold_lower is None else float(rc.rollout_rs_threshold_lower)
    return lower, upper


def _check_optim(optim: DictConfig, key: str) -> None:
    _require(optim.lr_scheduler_type in (None, *LR_SCHEDULES), f"{key}.lr_scheduler_type",
             f"{optim.lr_scheduler_type!r} is not valid; use one of {', '.join(LR_SCHEDULES)}")
    _require(optim.lr_decay_style in (None, *LR_DECAY_STYLES), f"{key}.lr_decay_style",
             f"{optim.lr_decay_style!r} is not valid; use one of {', '.join(LR_DECAY_STYLES)} (or null: "
             "lr_scheduler_type decides)")
    _require(optim.lr_wsd_decay_style in WSD_DECAY_STYLES, f"{key}.lr_wsd_decay_style",
             f"{optim.lr_wsd_decay_style!r} is not valid; use one of {', '.join(WSD_DECAY_STYLES)}")
    _require(optim.min_lr >= 0 and optim.lr_warmup_init >= 0, f"{key}.min_lr", "min_lr and lr_warmup_init must be >= 0")
    _require(optim.min_lr_ratio is None or 0 <= optim.min_lr_ratio <= 1, f"{key}.min_lr_ratio", "must be in [0, 1]")
    _require(optim.num_cycles > 0, f"{key}.num_cycles", "must be > 0 (0.5: one half cosine)")
    _require(optim.clip_grad is None or optim.clip_grad > 0, f"{key}.clip_grad", "must be > 0 (or null: grad_clip)")
    _require(optim.lr_decay_style != "WSD" or optim.lr_wsd_decay_steps is not None, f"{key}.lr_wsd_decay_steps",
             "lr_decay_style=WSD needs the steps of its final decay")
    for name in ("lr_decay_steps", "lr_wsd_decay_steps"):
        _require(optim[name] is None or optim[name] >= 1, f"{key}.{name}", "must be >= 1 step (or null)")


def _check_dtypes(section: DictConfig, key: str) -> None:
    for name in ("model_dtype", "dtype"):
        value = section[name]
        _require(value is None or value in DTYPES, f"{key}.{name}",
                 f"{value!r} is not supported; use bf16 or fp32 (fp16 needs loss scaling, which rlvr does not do)")


def _check_checkpoint(checkpoint: DictConfig, key: str) -> None:
    for name, value in (("save_contents", checkpoint.save_contents), ("load_contents", checkpoint.load_contents)):
        contents = list(value)
        unknown = [item for item in contents if item not in CHECKPOINT_CONTENTS]
        _require(not unknown, f"{key}.{name}", f"unknown contents {unknown}; use {', '.join(CHECKPOINT_CONTENTS)}")
        _require(not (key == "critic.checkpoint" and "hf_model" in contents), f"{key}.{name}",
                 "the critic (a backbone with a value head) has no Hugging Face model to export; remove hf_model")
        missing = [item for item in ("model", "optimizer", "extra") if item not in contents]
        _require(not missing, f"{key}.{name}", f"rlvr's checkpoints are whole, so that a resume continues the run "
                 f"exactly: add {missing} (hf_model may be added to save_contents)")


def _check_roles(cfg: DictConfig) -> None:
    arr = cfg.actor_rollout_ref
    for key, section in (("actor_rollout_ref.actor", arr.actor), ("critic", cfg.critic)):
        _check_optim(section.optim, f"{key}.optim")
        _check_checkpoint(section.checkpoint, f"{key}.checkpoint")
        _require(section.loss_scale_factor is None or section.loss_scale_factor > 0, f"{key}.loss_scale_factor",
                 "must be > 0 (or null: the response length)")
    for key, fsdp in (("actor_rollout_ref.actor.fsdp_config", arr.actor.fsdp_config),
                      ("actor_rollout_ref.ref.fsdp_config", arr.ref.fsdp_config),
                      ("critic.fsdp_config", cfg.critic.fsdp_config)):
        _check_dtypes(fsdp, key)
    actor = arr.actor
    _require(not cfg.critic.model.use_fused_kernels or not cfg.critic.enable, "critic.model.use_fused_kernels",
             "the critic computes values, not log-probs, so it has no fused log-prob head; set it to false")
    _require(actor.entropy_from_logits_chunk_size >= 1, "actor_rollout_ref.actor.entropy_from_logits_chunk_size",
             "must be >= 1 row")
    for key, nccl in (("actor_rollout_ref.nccl_timeout", arr.nccl_timeout), ("critic.nccl_timeout",
                                                                            cfg.critic.nccl_timeout)):
        _require(nccl is None or nccl > 0, key, "must be > 0 seconds (or null: trainer.call_timeout_s)")


def _check_dist_checkpointing(cfg: DictConfig) -> None:
    arr = cfg.actor_rollout_ref
    actor_strategy = arr.actor.strategy
    for key, strategy, megatron in (
            ("actor_rollout_ref.actor", actor_strategy, arr.actor.megatron),
            ("actor_rollout_ref.ref", arr.ref.strategy or actor_strategy, arr.ref.megatron),
            ("critic", cfg.critic.strategy, cfg.critic.megatron)):
        if not megatron.use_dist_checkpointing:
            continue
        name = f"{key}.megatron.use_dist_checkpointing"
        _require(strategy == "megatron", name, f"a Megatron distributed checkpoint starts a Megatron role; this role "
                 f"runs strategy={strategy} (set {key}.strategy=megatron, or this key to false)")
        path = megatron.dist_checkpointing_path
        _require(path is not None, f"{key}.megatron.dist_checkpointing_path",
                 "use_dist_checkpointing=true needs the checkpoint folder")
        _require((Path(path) / ".metadata").is_file(), f"{key}.megatron.dist_checkpointing_path",
                 f"{path!r} is not a Megatron distributed checkpoint folder (no .metadata file there)")


def _check_data(cfg: DictConfig) -> None:
    d = cfg.data
    for name in ("train_max_samples", "val_max_samples"):
        value = d[name]
        _require(value is None or value == -1 or value >= 1, f"data.{name}", "use a count >= 1, or -1 / null for all")
    _require(d.filter_overlong_prompts_workers >= 1, "data.filter_overlong_prompts_workers", "must be >= 1 process")
    custom = d.custom_cls
    if custom.path is not None:
        _require(custom.name is not None, "data.custom_cls.name", "name the dataset class defined in data.custom_cls.path")
        _require(not custom.path.endswith(".py") or Path(custom.path).is_file(), "data.custom_cls.path",
                 f"file {custom.path!r} does not exist")


def _check_rollout(cfg: DictConfig) -> None:
    rollout, key = cfg.actor_rollout_ref.rollout, "actor_rollout_ref.rollout"
    mt = rollout.multi_turn
    for name in ("max_assistant_turns", "max_user_turns"):
        _require(mt[name] is None or mt[name] >= 1, f"{key}.multi_turn.{name}", "must be >= 1 turn (or null: no limit)")
    _require(mt.tool_response_truncate_side in TRUNCATE_SIDES, f"{key}.multi_turn.tool_response_truncate_side",
             f"{mt.tool_response_truncate_side!r} is not valid; use one of {', '.join(TRUNCATE_SIDES)}")
    _require(rollout.dtype is None or rollout.dtype in DTYPES, f"{key}.dtype",
             f"{rollout.dtype!r} is not valid; use bfloat16 or float32 (or null: the actor's)")
    _require(rollout.scheduling_policy in SCHEDULING, f"{key}.scheduling_policy",
             f"{rollout.scheduling_policy!r} is not valid; use one of {', '.join(SCHEDULING)}")
    _require(rollout.checkpoint_engine.backend != "hccl", f"{key}.checkpoint_engine.backend",
             "hccl moves weights between Ascend NPUs, hardware rlvr does not run on; use naive")
    _require(rollout.checkpoint_engine.backend in CHECKPOINT_ENGINE_BACKENDS, f"{key}.checkpoint_engine.backend",
             f"{rollout.checkpoint_engine.backend!r} is not one of verl's backends ({', '.join(CHECKPOINT_ENGINE_BACKENDS)})")
    context = rollout.prompt_length + rollout.response_length
    _require(rollout.max_model_len is None or rollout.max_model_len >= context, f"{key}.max_model_len",
             f"{rollout.max_model_len} is shorter than prompt + response ({context} tokens); raise it or leave it null")
    if not rollout.calculate_log_probs:
        rc, needs = cfg.algorithm.rollout_correction, []
        if rc.rollout_is is not None or rc.rollout_rs is not None:
            needs.append("algorithm.rollout_correction.rollout_is / rollout_rs")
        if rc.bypass_mode:
            needs.append("algorithm.rollout_correction.bypass_mode")
        if cfg.async_training.mode != "sync":
            needs.append("async_training (decoupled PPO weighs the behaviour policy's log-probs)")
        _require(not needs, f"{key}.calculate_log_probs", f"false drops the rollout's log-probs, which {', '.join(needs)} "
                 "need; set it to true")


def _check_rollout_correction(cfg: DictConfig) -> None:
    rc, key = cfg.algorithm.rollout_correction, "algorithm.rollout_correction"
    parse_threshold(rc.rollout_is_threshold, f"{key}.rollout_is_threshold")
    if rc.rollout_rs_threshold is not None and not is_rs_option_list(rc.rollout_rs):
        parse_threshold(rc.rollout_rs_threshold, f"{key}.rollout_rs_threshold")
    _require(rc.loss_type in CORRECTION_LOSSES, f"{key}.loss_type",
             f"{rc.loss_type!r} is not valid; use one of {', '.join(CORRECTION_LOSSES)}")
    _require(rc.loss_type == "ppo_clip" or rc.bypass_mode, f"{key}.loss_type",
             "loss_type=reinforce is the loss of bypass_mode (the rollout's log-probs as the old policy); set "
             "bypass_mode=true or loss_type=ppo_clip")


def check_verl_settings(cfg: DictConfig) -> None:
    """Raise :class:`ConfigError` for a bad value of a setting that verl 0.9's config names."""
    _check_roles(cfg)
    _check_dist_checkpointing(cfg)
    _check_data(cfg)
    _check_rollout(cfg)
    _check_rollout_correction(cfg)
    _require(cfg.trainer.max_critic_ckpt_to_keep is None or cfg.trainer.max_critic_ckpt_to_keep >= 1,
             "trainer.max_critic_ckpt_to_keep", "keep at least 1 (or null to keep all)")
