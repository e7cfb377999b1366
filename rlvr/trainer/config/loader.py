"""Build a run's configuration: schema defaults, a YAML preset, a user's Hydra config, then the
command line's overrides.

The command line is verl's: Hydra's override grammar (``key=value``, ``+key=value``, ``++key=value``,
``~key``, lists, quoting) and ``--config-path DIR --config-name NAME`` for a YAML whose ``defaults:``
list builds on rlvr's ``ppo_trainer`` / ``ppo_megatron_trainer`` (config groups such as
``model_engine=megatron`` included). hydra-core parses and composes (:mod:`~rlvr.trainer.config.compose`);
verl's keys that are not schema fields are translated or checked
(:mod:`~rlvr.trainer.config.verl_translate`); the result is an OmegaConf ``DictConfig`` backed by
:class:`~rlvr.trainer.config.schema.RlvrConfig`, so a misspelt key or a value of the wrong type is
rejected with a :class:`ConfigError` that names the key. A preset may start from another preset with
a top-level ``base: <preset name>`` entry.

Where verl's and rlvr's grammar differ: ``+key=value`` on a key rlvr's schema has (verl's config
lacks it, so verl's scripts add it) sets it; ``~key`` resets a key to rlvr's default.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import re
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from rlvr.trainer.config.builtin_names import BUILTIN_ESTIMATOR_NEEDS
from rlvr.trainer.config.compose import GROUPS, compose, parse_overrides, resolve_config_dir
from rlvr.reward.verl_keys import migrate_reward_keys
from rlvr.trainer.config.schema import RlvrConfig
from rlvr.trainer.config.suggest import suggest_key
from rlvr.trainer.config.verl_pending import pending_rule
from rlvr.trainer.config.verl_rules import alias_for, rule_for
from rlvr.trainer.config.verl_translate import TARGET_KEY, SchemaShape, translate
from rlvr.trainer.user_code import import_run_modules
from rlvr.utils.errors import ConfigError

PRESET_DIR = Path(__file__).parent / "presets"
_BASE_KEY = "base"


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


def _merge(layers: Sequence[Any], origin: str) -> DictConfig:
    try:
        return OmegaConf.merge(*layers)
    except ConfigKeyError as err:
        key = _dotted_key(err)
        raise ConfigError(key, f"unknown key (from {origin}){suggest_key(key)}; `rlvr --help-config` lists "
                          "every valid key") from None
    except ValidationError as err:
        raise ConfigError(_dotted_key(err), f"wrong value type (from {origin}): {str(err.msg).splitlines()[0]}") from None


@functools.cache
def schema_shape() -> SchemaShape:
    """The schema's leaves, free-form dicts, lists and defaults (for the translation)."""
    leaves, free, lists, defaults, helps, bools, optionals = set(), set(), set(), {}, {}, set(), set()

    def walk(cls: type, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        for fld in dataclasses.fields(cls):
            key, hint = f"{prefix}{fld.name}", hints[fld.name]
            if isinstance(hint, type) and dataclasses.is_dataclass(hint):
                walk(hint, f"{key}.")
                continue
            leaves.add(key)
            if hint is bool:
                bools.add(key)
            if type(None) in typing.get_args(hint):
                optionals.add(key)
            origin = typing.get_origin(hint) or hint
            if origin is dict:
                free.add(key)
            elif origin is list:
                lists.add(key)
            defaults[key] = fld.default_factory() if fld.default_factory is not dataclasses.MISSING else fld.default
            helps[key] = fld.metadata.get("help", "")

    walk(RlvrConfig, "")
    return SchemaShape(frozenset(leaves), frozenset(free), frozenset(lists), defaults, helps, frozenset(bools),
                       frozenset(optionals))


def _verl_key(key: str) -> bool:
    """A verl key that is not a schema field but that rlvr reads (alias, pending, rule, _target_)."""
    return (key.rpartition(".")[2] == TARGET_KEY or alias_for(key) is not None or pending_rule(key) is not None
            or rule_for(key) is not None)


def _under_free_dict(key: str, shape: SchemaShape) -> bool:
    return any(key.startswith(f"{free}.") for free in shape.free_dicts)


@functools.cache
def _schema_template() -> DictConfig:
    return OmegaConf.structured(RlvrConfig)


def _schema_config() -> DictConfig:
    """A fresh typed config of the schema's defaults: a copy of one built per process (building it
    from the dataclasses takes about 0.3 s, a copy about 0.03 s)."""
    return copy.deepcopy(_schema_template())


_HYDRA_KEY_PART = re.compile(r"[\w.-]+")


def _split_dict_entries(items: Sequence[str], shape: SchemaShape) -> tuple[list[str], list[tuple[str, str, str]]]:
    """The overrides Hydra parses, and the entries of a free-form dict whose name Hydra's key grammar
    cannot hold (``reward.routes.openai/gsm8k=naive``: a data source with a slash), as
    ``(dict key, entry name, value)`` that rlvr sets itself after composing."""
    kept, entries = [], []
    for item in items:
        key, _, value = item.lstrip("+").partition("=")
        free = next((name for name in shape.free_dicts if key.startswith(f"{name}.")), None)
        entry = key[len(free) + 1:] if free else ""
        if free and "=" in item and not _HYDRA_KEY_PART.fullmatch(entry):
            entries.append((free, entry, value.strip().strip("'\"")))
        else:
            kept.append(item)
    return kept, entries


def _set_dict_entries(cfg: DictConfig, entries: Sequence[tuple[str, str, str]]) -> None:
    """Set the entries :func:`_split_dict_entries` took out (in command-line order)."""
    for dict_key, name, value in entries:
        node = OmegaConf.select(cfg, dict_key)
        with open_dict(node):
            node[name] = value


def _prepare_overrides(items: Sequence[str], shape: SchemaShape, groups: set[str]) -> tuple[list[str], list]:
    """Hydra override strings to compose with, and the ``~key`` deletions rlvr applies itself.

    ``+key`` on a schema key becomes ``++key`` (set it); ``key=value`` on a verl key that is not a
    schema field becomes ``++key=value`` (the composed config does not hold it); an unknown key is
    reported here with "did you mean"."""
    ready, deletions = [], []
    for item, override in zip(items, parse_overrides(items)):
        key = override.key_or_group
        deletions = [earlier for earlier in deletions if earlier.key_or_group != key]  # a later value wins
        if override.package is not None or key in groups or key.startswith("hydra."):
            ready.append(item)
        elif override.is_delete():
            deletions.append(override)
        elif override.is_add() and (key in shape.leaves or _verl_key(key)):
            ready.append("+" + item)
        elif key in shape.free_dicts and not (override.is_add() or override.is_force_add()):
            ready.append("++" + item)  # a whole free-form dict: new keys in a struct config need Hydra's ++
        elif not (override.is_add() or override.is_force_add()) and key not in shape.leaves and key not in groups:
            if _verl_key(key):
                ready.append("++" + item)
            elif _under_free_dict(key, shape):  # an entry of a free-form dict (rlvr's key=value adds it)
                ready.append("++" + item)
            else:
                raise ConfigError(key, f"unknown key (from the command line){suggest_key(key)}; "
                                  "`rlvr --help-config` lists every valid key")
        else:
            ready.append(item)
    return ready, deletions


def _delete(cfg: DictConfig, deletions: Sequence[Any]) -> None:
    """Apply ``~key`` / ``~key=value``: the key goes back to rlvr's default (the typed merge fills it)."""
    for override in deletions:
        key = override.key_or_group
        current = OmegaConf.select(cfg, key, default=None, throw_on_missing=False)
        expected = override.value()
        if expected is not None and expected != current:
            raise ConfigError(key, f"~{key}={expected} deletes only that value, but the key is {current!r}")
        parent_key, _, name = key.rpartition(".")
        parent = OmegaConf.select(cfg, parent_key) if parent_key else cfg
        if isinstance(parent, DictConfig) and name in parent:
            with open_dict(parent):
                del parent[name]


def _origin(key: str, overrides: Sequence[str], config_name: str | None, preset: str | None) -> str:
    if any(key in item for item in overrides):
        return "the command line"
    if config_name:
        return f"config {config_name!r}"
    return f"preset {preset!r}" if preset else "the config"


def _per_rank(global_size: int | None, per_rank: Any, whole: int, dp: int) -> int:
    """verl's micro-batch settings as one per-rank size: an older global size divided by the
    data-parallel ranks, else the per-rank size, else (None) ``whole`` (everything at once)."""
    if global_size is not None:
        return max(1, int(global_size) // dp)
    return whole if per_rank is None else per_rank


def _micro_batches(cfg: DictConfig) -> None:
    """Resolve every micro-batch size to sequences per rank (``*_per_gpu``)."""
    from rlvr.workers.megatron.layout import data_parallel_size

    arr, n = cfg.actor_rollout_ref, cfg.actor_rollout_ref.rollout.n
    actor_dp, critic_dp = data_parallel_size(cfg, "actor"), data_parallel_size(cfg, "critic")
    step = max(1, cfg.data.train_batch_size * n // actor_dp)
    actor = arr.actor
    actor.ppo_micro_batch_size_per_gpu = _per_rank(actor.ppo_micro_batch_size, actor.ppo_micro_batch_size_per_gpu,
                                                   max(1, actor.ppo_mini_batch_size * n // actor_dp), actor_dp)
    for section in (arr.rollout, arr.ref):
        section.log_prob_micro_batch_size_per_gpu = _per_rank(
            section.log_prob_micro_batch_size, section.log_prob_micro_batch_size_per_gpu, step, actor_dp)
    critic = cfg.critic
    critic.ppo_micro_batch_size_per_gpu = _per_rank(critic.ppo_micro_batch_size, critic.ppo_micro_batch_size_per_gpu,
                                                    max(1, critic.ppo_mini_batch_size * n // critic_dp), critic_dp)
    critic.forward_micro_batch_size_per_gpu = _per_rank(
        critic.forward_micro_batch_size, critic.forward_micro_batch_size_per_gpu,
        max(1, cfg.data.train_batch_size * n // critic_dp), critic_dp)


def finalize_config(cfg: DictConfig) -> DictConfig:
    """Import the user's modules (``trainer.user_modules``, verl's ``model.external_lib``: see
    :mod:`rlvr.trainer.user_code`), then fill the derived fields: rollout lengths from ``data``, the
    data seed from ``trainer.seed``, the critic's model and tokenizer from the actor's (verl's
    defaults), ``critic.enable`` from what the estimator's registry entry needs (an unknown
    estimator leaves it off; validation then names the estimator), verl's reward keys onto
    ``reward.reward_model`` and the reward manager (:mod:`rlvr.reward.verl_keys`), and the tools file of
    ``tool_agent`` as an absolute path (read by rollout workers, which may run in another working
    directory), and every micro-batch size as sequences per rank (verl's older global sizes divided
    by the data-parallel ranks; None: the rank's whole batch)."""
    import_run_modules(cfg)
    migrate_reward_keys(cfg)
    rollout = cfg.actor_rollout_ref.rollout
    rollout.response_length = cfg.data.max_response_length
    rollout.prompt_length = cfg.data.max_prompt_length
    if rollout.multi_turn.tool_config_path is not None:
        rollout.multi_turn.tool_config_path = str(Path(rollout.multi_turn.tool_config_path).absolute())
    if cfg.data.seed is None:
        cfg.data.seed = cfg.trainer.seed
    _micro_batches(cfg)
    critic_model, actor_model = cfg.critic.model, cfg.actor_rollout_ref.model
    if critic_model.path is None:
        critic_model.path = actor_model.path
    if critic_model.tokenizer_path is None:
        critic_model.tokenizer_path = actor_model.tokenizer_path or actor_model.path
    if cfg.critic.enable is None:
        estimator = cfg.algorithm.adv_estimator
        if estimator in BUILTIN_ESTIMATOR_NEEDS:  # a built-in name cannot be registered again: no torch needed
            cfg.critic.enable = BUILTIN_ESTIMATOR_NEEDS[estimator].needs_critic
        else:
            from rlvr.trainer.ppo.advantage import ADV_ESTIMATOR_REGISTRY

            cfg.critic.enable = (ADV_ESTIMATOR_REGISTRY.has(estimator)
                                 and ADV_ESTIMATOR_REGISTRY.metadata(estimator).needs_critic)
    return cfg


def load_config(preset: str | None = None, overrides: Sequence[str] = (), config_name: str | None = None,
                config_path: str | None = None) -> DictConfig:
    """Load a run configuration.

    Args:
        preset: a preset name (``grpo``, ``ppo``, ``main_job``, ... see :func:`list_presets`), the
            path of a YAML file, or None for the schema defaults.
        overrides: Hydra overrides applied last, e.g. ``["trainer.seed=3", "+data.seed=1", "~trainer.logger"]``.
        config_name: verl's ``--config-name``: a YAML in ``config_path`` (or ``ppo_trainer`` /
            ``ppo_megatron_trainer``); None: ``ppo_trainer``.
        config_path: verl's ``--config-path``: the folder of ``config_name``.

    Returns:
        A typed ``DictConfig`` of :class:`RlvrConfig`, finalised by :func:`finalize_config`.
        Validate it with :func:`rlvr.trainer.config.validate_config` before starting workers.

    Raises:
        ConfigError: unknown preset or config, an override that does not parse, an unknown key, a
            value of the wrong type, or a verl key rlvr refuses (with the reason).
    """
    schema = _schema_config()
    base = _merge([schema, *_load_preset(preset)], f"preset {preset!r}") if preset else schema
    shape = schema_shape()
    hydra_overrides, entries = _split_dict_entries(overrides, shape)
    ready, deletions = _prepare_overrides(hydra_overrides, shape, set(GROUPS))
    composed = compose(OmegaConf.to_container(base, resolve=False), config_name, resolve_config_dir(config_path),
                       ready)
    _delete(composed, deletions)
    _set_dict_entries(composed, entries)
    plain, _ = translate(composed, shape)
    try:
        typed = OmegaConf.merge(schema, plain)
    except ConfigKeyError as err:
        key = _dotted_key(err)
        raise ConfigError(key, f"unknown key (from {_origin(key, overrides, config_name, preset)}){suggest_key(key)}; "
                          "`rlvr --help-config` lists every valid key") from None
    except ValidationError as err:
        key = _dotted_key(err)
        raise ConfigError(key, f"wrong value type (from {_origin(key, overrides, config_name, preset)}): "
                          f"{str(err.msg).splitlines()[0]}") from None
    return finalize_config(typed)


def to_config(config: Any) -> DictConfig:
    """Accept an ``RlvrConfig`` instance or a ``DictConfig`` and return a finalised ``DictConfig``."""
    if isinstance(config, RlvrConfig):
        return finalize_config(OmegaConf.structured(config))
    if isinstance(config, DictConfig):
        return config
    raise TypeError(f"expected RlvrConfig or DictConfig, got {type(config).__name__}")


def help_config(schema: type = RlvrConfig) -> str:
    """Every config key of ``schema`` with its default and help text (``rlvr --help-config``; the
    tools pass their own schema)."""
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

    walk(schema, "")
    return "\n".join(lines).lstrip("\n") + "\n"
