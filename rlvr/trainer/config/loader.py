"""Build a run's configuration: schema defaults, then a YAML preset, then ``key=value`` overrides.

The result is an OmegaConf ``DictConfig`` backed by :class:`~rlvr.trainer.config.schema.RlvrConfig`,
so a misspelt key or a value of the wrong type is rejected with a :class:`ConfigError` that names the
key. A preset may start from another preset with a top-level ``base: <preset name>`` entry.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from rlvr.reward.verl_keys import migrate_reward_keys
from rlvr.trainer.config.schema import RlvrConfig
from rlvr.trainer.config.suggest import suggest_key
from rlvr.trainer.user_code import import_run_modules
from rlvr.utils.errors import ConfigError

PRESET_DIR = Path(__file__).parent / "presets"
_BASE_KEY = "base"
VERL_KEYS_WITHOUT_MEANING = {
    "data.dataloader_num_workers": "rlvr tokenizes the prompts once when the dataset loads and builds each "
                                   "batch in the driver, so there are no DataLoader workers to set; remove the key",
    "actor_rollout_ref.ref.fsdp_config.optimizer_offload": "the reference policy is frozen and has no optimizer "
                                                           "state to offload; remove the key (param_offload "
                                                           "offloads its weights)",
}
"""Keys of verl's config that rlvr has no use for, with what to do instead."""


def list_presets() -> list[str]:
    """Names of the presets shipped with rlvr (``rlvr/trainer/config/presets/*.yaml``)."""
    return sorted(path.stem for path in PRESET_DIR.glob("*.yaml"))


def _preset_path(preset: str) -> Path:
    path = Path(preset)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return path
    path = PRESET_DIR / f"{preset}.yaml"
    if not path.is_file():
        raise ConfigError("preset", f"unknown preset {preset!r}; use one of {', '.join(list_presets())} "
                          "or the path of a YAML file")
    return path


def _load_preset(preset: str, seen: tuple[str, ...] = ()) -> list[DictConfig]:
    """The preset's YAML layers, base presets first."""
    if preset in seen:
        raise ConfigError("base", f"presets include each other in a loop: {' -> '.join((*seen, preset))}")
    layer = OmegaConf.load(_preset_path(preset))
    base = layer.pop(_BASE_KEY, None)
    return [*(_load_preset(str(base), (*seen, preset)) if base else []), layer]


def _dotted_key(err: OmegaConfBaseException) -> str:
    return str(err.full_key) if getattr(err, "full_key", None) else "?"


def _merge(layers: Sequence[DictConfig], origin: str) -> DictConfig:
    try:
        return OmegaConf.merge(*layers)
    except ConfigKeyError as err:
        key = _dotted_key(err)
        if key in VERL_KEYS_WITHOUT_MEANING:
            raise ConfigError(key, f"{VERL_KEYS_WITHOUT_MEANING[key]} (from {origin})") from None
        raise ConfigError(key, f"unknown key (from {origin}){suggest_key(key)}; `rlvr --help-config` lists "
                          "every valid key") from None
    except ValidationError as err:
        raise ConfigError(_dotted_key(err), f"wrong value type (from {origin}): {str(err.msg).splitlines()[0]}") from None


def _parse_overrides(overrides: Sequence[str]) -> DictConfig:
    for item in overrides:
        if "=" not in item:
            raise ConfigError(item, "an override must look like key=value, e.g. algorithm.adv_estimator=grpo")
    try:
        return OmegaConf.from_dotlist(list(overrides))
    except OmegaConfBaseException as err:
        raise ConfigError(_dotted_key(err), f"cannot parse the override: {str(err.msg).splitlines()[0]}") from None


def finalize_config(cfg: DictConfig) -> DictConfig:
    """Import the user's modules (``trainer.user_modules``, verl's ``model.external_lib``: see
    :mod:`rlvr.trainer.user_code`), then fill the derived fields: rollout lengths from ``data``, the
    data seed from ``trainer.seed``, the critic's model and tokenizer from the actor's (verl's
    defaults), ``critic.enable`` from what the estimator's registry entry needs (an unknown
    estimator leaves it off; validation then names the estimator), verl's reward keys onto
    ``reward.reward_model`` and the reward manager (:mod:`rlvr.reward.verl_keys`), and the tools file of
    ``tool_agent`` as an absolute path (read by rollout workers, which may run in another working
    directory)."""
    import_run_modules(cfg)
    migrate_reward_keys(cfg)
    rollout = cfg.actor_rollout_ref.rollout
    rollout.response_length = cfg.data.max_response_length
    rollout.prompt_length = cfg.data.max_prompt_length
    if rollout.multi_turn.tool_config_path is not None:
        rollout.multi_turn.tool_config_path = str(Path(rollout.multi_turn.tool_config_path).absolute())
    if cfg.data.seed is None:
        cfg.data.seed = cfg.trainer.seed
    critic_model, actor_model = cfg.critic.model, cfg.actor_rollout_ref.model
    if critic_model.path is None:
        critic_model.path = actor_model.path
    if critic_model.tokenizer_path is None:
        critic_model.tokenizer_path = actor_model.tokenizer_path or actor_model.path
    if cfg.critic.enable is None:
        from rlvr.trainer.ppo.advantage import ADV_ESTIMATOR_REGISTRY

        estimator = cfg.algorithm.adv_estimator
        cfg.critic.enable = (ADV_ESTIMATOR_REGISTRY.has(estimator)
                             and ADV_ESTIMATOR_REGISTRY.metadata(estimator).needs_critic)
    return cfg


def load_config(preset: str | None = None, overrides: Sequence[str] = ()) -> DictConfig:
    """Load a run configuration.

    Args:
        preset: a preset name (``grpo``, ``ppo``, ``main_job``, ... see :func:`list_presets`), the
            path of a YAML file, or None for the schema defaults.
        overrides: dotted ``key=value`` strings applied last, e.g. ``["trainer.seed=3"]``.

    Returns:
        A typed ``DictConfig`` of :class:`RlvrConfig`, finalised by :func:`finalize_config`.
        Validate it with :func:`rlvr.trainer.config.validate_config` before starting workers.

    Raises:
        ConfigError: unknown preset, unknown key, or a value of the wrong type.
    """
    layers = [OmegaConf.structured(RlvrConfig)]
    if preset:
        layers.append(_merge([layers[0], *_load_preset(preset)], f"preset {preset!r}"))
    if overrides:
        layers.append(_merge([layers[-1], _parse_overrides(overrides)], "the command line"))
    return finalize_config(layers[-1])


def to_config(config: Any) -> DictConfig:
    """Accept an ``RlvrConfig`` instance or a ``DictConfig`` and return a finalised ``DictConfig``."""
    if isinstance(config, RlvrConfig):
        return finalize_config(OmegaConf.structured(config))
    if isinstance(config, DictConfig):
        return config
    raise TypeError(f"expected RlvrConfig or DictConfig, got {type(config).__name__}")


def help_config() -> str:
    """Every config key with its default and help text (``rlvr --help-config``)."""
    lines: list[str] = []

    def walk(cls: type, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        for fld in dataclasses.fields(cls):
            key, help_text = f"{prefix}{fld.name}", fld.metadata.get("help", "")
            hint = hints[fld.name]
            if isinstance(hint, type) and dataclasses.is_dataclass(hint):
                lines.append(f"\n[{key}] {help_text}")
                walk(hint, f"{key}.")
                continue
            default = fld.default_factory() if fld.default_factory is not dataclasses.MISSING else fld.default
            lines.append(f"  {key} = {default!r}\n      {help_text}")

    walk(RlvrConfig, "")
    return "\n".join(lines).lstrip("\n") + "\n"
