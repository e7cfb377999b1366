"""verl's reward keys, old and new, onto the one section rlvr's code reads.

verl 0.9 moved its reward settings under ``reward`` (``reward.reward_manager``,
``reward.reward_model``, ``reward.custom_reward_function``) and still maps the older keys
(``reward_model.enable``, ``reward_model.model.path``, ``reward_model.reward_manager``, ...) onto
them, the older key winning when it is set. :func:`migrate_reward_keys` does the same when a config
loads, so that:

- the reward model is described by ``reward.reward_model`` alone (legacy ``reward_model.*`` keys
  copied there, ``reward_model.max_length`` as ``rollout.max_model_len``);
- the reward manager by ``reward_model.reward_manager`` (verl 0.9's ``reward.reward_manager`` copied
  there; ``source=importlib`` becomes the object path ``<module.path>:<module.name>``);
- the custom scoring function by the top-level ``custom_reward_function``.

A key set two ways to two different values is an error naming both. Torch-free.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from rlvr.reward.config import RewardModelConfig
from rlvr.reward.rm_config import RMRolloutConfig
from rlvr.utils.errors import ConfigError

__all__ = ["migrate_reward_keys", "LEGACY_RM_KEYS"]

DEFAULT_MANAGER = "naive"
DEFAULT_MANAGER_PROCESSES = 2

LEGACY_RM_KEYS = ("reward_model.enable", "reward_model.enable_resource_pool", "reward_model.n_gpus_per_node",
                  "reward_model.nnodes", "reward_model.model.path", "reward_model.model.input_tokenizer",
                  "reward_model.model.trust_remote_code", "reward_model.micro_batch_size_per_gpu",
                  "reward_model.use_dynamic_bsz", "reward_model.forward_max_token_len_per_gpu", "reward_model.max_length",
                  "reward_model.rollout")
"""The legacy reward-model keys (verl's migration, plus the pre-0.6 keys of its FSDP reward-model worker)."""


def _legacy_reward_model(legacy: RewardModelConfig) -> dict[str, Any]:
    """Field of ``reward.reward_model`` -> the value a legacy key sets (None: not set)."""
    return {
        "enable": legacy.enable, "enable_resource_pool": legacy.enable_resource_pool,
        "n_gpus_per_node": legacy.n_gpus_per_node, "nnodes": legacy.nnodes, "model_path": legacy.model.path,
        "input_tokenizer": legacy.model.input_tokenizer, "trust_remote_code": legacy.model.trust_remote_code,
        "micro_batch_size_per_gpu": legacy.micro_batch_size_per_gpu, "use_dynamic_bsz": legacy.use_dynamic_bsz,
        "forward_max_token_len_per_gpu": legacy.forward_max_token_len_per_gpu,
    }


def _migrate_manager(cfg: DictConfig) -> None:
    legacy, new = cfg.reward_model, cfg.reward.reward_manager
    if legacy.reward_manager is None:  # verl's generated config leaves the legacy keys unset (null)
        legacy.reward_manager = DEFAULT_MANAGER
    if legacy.num_workers is None:
        legacy.num_workers = DEFAULT_MANAGER_PROCESSES
    if legacy.reward_loop_source is not None:  # verl: the legacy keys override the new ones
        new.source = legacy.reward_loop_source
        new.module.path = legacy.reward_loop_module_path
        new.module.name = legacy.reward_loop_class_name or new.module.name
    if new.source == "importlib":
        if new.module.path is None:
            raise ConfigError("reward.reward_manager.module.path", "source=importlib needs the file (or module) that "
                              "defines the reward manager class; set module.path and module.name")
        name = f"{new.module.path}:{new.module.name}"
    elif new.source == "register":
        name = new.name
    else:
        raise ConfigError("reward.reward_manager.source", f"{new.source!r} is not a source; use register (a "
                          "registered name in reward.reward_manager.name) or importlib (module.path and module.name)")
    if name is None or name == legacy.reward_manager:
        return
    if legacy.reward_manager != DEFAULT_MANAGER:
        raise ConfigError("reward.reward_manager", f"names the reward manager {name!r} but reward_model.reward_manager "
                          f"(verl's legacy key) names {legacy.reward_manager!r}; set only one of them")
    legacy.reward_manager = name


def _migrate_custom_function(cfg: DictConfig) -> None:
    new, top = cfg.reward.custom_reward_function, cfg.custom_reward_function
    if new.path is None:
        return
    if top.path is not None and (top.path, top.name) != (new.path, new.name):
        raise ConfigError("reward.custom_reward_function.path", f"names {new.path}:{new.name} but "
                          f"custom_reward_function names {top.path}:{top.name}; set only one of them")
    top.path, top.name = new.path, new.name


def _migrate_reward_model(cfg: DictConfig) -> None:
    legacy, rm = cfg.reward_model, cfg.reward.reward_model
    for target, value in _legacy_reward_model(legacy).items():
        if value is not None:
            rm[target] = value
    if legacy.max_length is not None:
        rm.rollout.max_model_len = legacy.max_length
    valid = set(RMRolloutConfig.__dataclass_fields__)
    for key, value in legacy.rollout.items():
        if key not in valid:
            raise ConfigError(f"reward_model.rollout.{key}", f"unknown key; the keys of reward.reward_model.rollout "
                              f"are {', '.join(sorted(valid))}")
        if value is not None:
            rm.rollout[key] = value


def migrate_reward_keys(cfg: DictConfig) -> DictConfig:
    """Map verl's reward keys onto ``reward.reward_model``, ``reward_model.reward_manager`` and
    ``custom_reward_function`` (see the module docstring); returns ``cfg``, changed in place.

    Raises:
        ConfigError: a key set two ways to different values, or a bad ``reward_manager.source``.
    """
    _migrate_manager(cfg)
    _migrate_custom_function(cfg)
    _migrate_reward_model(cfg)
    return cfg
