"""Hydra composition of a run config, as verl's launch scripts use it (standard library, OmegaConf and
hydra-core only: the command runs it before torch).

verl's ``main_ppo`` is a Hydra app, so its users write Hydra's override grammar (``key=value``,
``+key=value``, ``++key=value``, ``~key``, lists ``key=[a,b]``, quoting) and compose their own YAML on
verl's defaults (``--config-path DIR --config-name NAME`` with ``defaults: [ppo_trainer, _self_]``,
config groups such as ``model_engine=megatron``). rlvr hands both to hydra-core itself:

- :func:`parse_overrides` parses the command line with Hydra's own grammar (``OverridesParser``);
- :func:`compose` composes with Hydra's ``compose`` API (or, for ``ppo_trainer`` with plain
  overrides, the same steps without it: :func:`compose_default`). rlvr's configs are registered in Hydra's
  ``ConfigStore`` (always on the search path, whatever ``hydra.searchpath`` a user's YAML names):
  ``rlvr_base`` (the schema's defaults, a preset on top), ``ppo_trainer`` and
  ``ppo_megatron_trainer`` and the ``model_engine`` group (the YAML files in ``hydra/`` next to this
  module). Without ``--config-path`` Hydra searches the ConfigStore only.

The composed config is plain (untyped); :mod:`rlvr.trainer.config.loader` types and checks it.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlvr.utils.errors import ConfigError

CONFIG_DIR = Path(__file__).parent / "hydra"
"""rlvr's Hydra configs: ``ppo_trainer.yaml``, ``ppo_megatron_trainer.yaml``, ``model_engine/``. They
reach Hydra through its ConfigStore only (a file config of the same name on the search path would
make Hydra treat the stored one as its schema)."""
TRAINER_DIR = Path(__file__).parents[1]
"""Where a relative ``--config-path`` is looked up first (Hydra: the directory of the app's module,
``rlvr/trainer`` for ``rlvr.trainer.main_ppo``); then the working directory."""
DEFAULT_CONFIG_NAME = "ppo_trainer"
BASE_NAME = "rlvr_base"
GROUPS = ("model_engine",)


def _quiet() -> None:
    """Silence what hydra-core says about itself (1.3 on OmegaConf 2.4: its resolvers are registered
    with a call 2.4 deprecates, it assigns its own version field; 1.4: version_base): nothing about
    the user's config."""
    warnings.filterwarnings("ignore", message="register_new_resolver", category=UserWarning)
    warnings.filterwarnings("ignore", message=".*version_base", category=Warning)
    warnings.filterwarnings("ignore", category=FutureWarning, module="hydra")


def _hydra() -> Any:
    """Import hydra-core quietly (:func:`_quiet`)."""
    with warnings.catch_warnings():
        _quiet()
        import hydra
        from hydra.core import utils  # noqa: F401 - registers the resolvers
    return hydra


def parse_overrides(items: Sequence[str]) -> list[Any]:
    """The command line's overrides as Hydra ``Override`` objects (Hydra's grammar).

    Raises:
        ConfigError: an item that is not an override, or a sweep (``key=a,b``: rlvr runs one config).
    """
    _hydra()
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    parsed = []
    for item in items:
        if "=" not in item and not item.startswith("~"):
            raise ConfigError(item, "an override must look like key=value, e.g. algorithm.adv_estimator=grpo")
        try:
            override = parser.parse_override(item)
        except HydraException as err:  # OverrideParseException (1.3) or the parser's own error (1.4)
            raise ConfigError(item, f"cannot parse the override: {str(err).splitlines()[0]}") from None
        if override.is_sweep_override():
            raise ConfigError(override.key_or_group, f"{item!r} is a sweep (several values); rlvr runs one "
                              "config per command: give one value")
        parsed.append(override)
    return parsed


_STATIC_STORED: list[bool] = []
"""Non-empty once rlvr's ``ppo_trainer``, ``ppo_megatron_trainer`` and config groups are in the store."""


def _store(base: dict) -> None:
    """Register rlvr's configs in Hydra's ConfigStore (replacing earlier ones: hydra-core 1.3
    replaces an entry it is given again, 1.4 does so when asked with ``replace=True``)."""
    _hydra()
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    replace = {"replace": True} if "replace" in inspect.signature(store.store).parameters else {}
    store.store(name=BASE_NAME, node=base, **replace)
    if _STATIC_STORED:  # rlvr's own YAML files: stored once per process
        return
    _STATIC_STORED.append(True)
    for name in ("ppo_trainer", "ppo_megatron_trainer"):
        store.store(name=name, node=OmegaConf.load(CONFIG_DIR / f"{name}.yaml"), **replace)
    for group in GROUPS:
        for path in sorted((CONFIG_DIR / group).glob("*.yaml")):
            node = OmegaConf.load(path)
            store.store(group=group, name=path.stem, node=node, package="_global_", **replace)


def group_options(group: str) -> list[str]:
    """The options of one of rlvr's config groups (e.g. ``model_engine``: dp, megatron, ...)."""
    return sorted(path.stem for path in (CONFIG_DIR / group).glob("*.yaml"))


def resolve_config_dir(config_path: str | None) -> Path | None:
    """The directory of ``--config-path``: absolute as given; relative to ``rlvr/trainer`` (Hydra's
    rule for the app's module), else to the working directory.

    Raises:
        ConfigError: no such directory.
    """
    if config_path is None:
        return None
    path = Path(config_path).expanduser()
    candidates = [path] if path.is_absolute() else [TRAINER_DIR / path, Path.cwd() / path]
    for candidate in candidates:
        if candidate.is_dir():
            return candidate.resolve()
    raise ConfigError("--config-path", f"{config_path!r} is not a directory (looked in "
                      f"{', '.join(str(c) for c in candidates)}); give the folder of your YAML config")


def compose(base: dict, config_name: str | None, config_dir: Path | None, overrides: Sequence[str]) -> DictConfig:
    """Compose ``config_name`` (default ``ppo_trainer``) from ``config_dir`` (or rlvr's configs)
    with Hydra, ``base`` as ``rlvr_base``, and apply ``overrides``. ``ppo_trainer`` without a config
    folder and with plain overrides (most loads) is built the same way without Hydra's compose
    (:func:`compose_default`).

    Returns:
        the composed plain config (no ``hydra`` node).

    Raises:
        ConfigError: a config that is not found, a config group option that does not exist, or an
            override Hydra cannot apply, with Hydra's reason.
    """
    name = (config_name or DEFAULT_CONFIG_NAME).removesuffix(".yaml").removesuffix(".yml")
    if config_dir is None and name == DEFAULT_CONFIG_NAME:
        plain = compose_default(base, overrides)
        if plain is not None:
            return plain
    return compose_with_hydra(base, name, config_dir, overrides)


def compose_with_hydra(base: dict, name: str, config_dir: Path | None, overrides: Sequence[str]) -> DictConfig:
    """:func:`compose` by Hydra's ``compose`` API (``name`` without its ``.yaml``)."""
    hydra = _hydra()
    from hydra.errors import HydraException, MissingConfigException

    _store(base)
    try:
        with warnings.catch_warnings():
            _quiet()
            start = (hydra.initialize_config_dir(config_dir=str(config_dir), version_base=None) if config_dir
                     else hydra.initialize(config_path=None, version_base=None))
            with start:
                return hydra.compose(config_name=name, overrides=list(overrides))
    except MissingConfigException as err:
        key = "--config-name" if name in str(err) and "group" not in str(err) else "config group"
        raise ConfigError(key, f"{_first_line(err)}; rlvr's configs: ppo_trainer, ppo_megatron_trainer, "
                          f"model_engine={'|'.join(group_options('model_engine'))}"
                          f"{f' (and the YAML files in {config_dir})' if config_dir else ''}") from None
    except HydraException as err:
        raise ConfigError(_failed_key(err), _first_line(err)) from None


@functools.cache
def _default_groups() -> dict:
    """The config group options ``ppo_trainer.yaml``'s defaults list picks (``model_engine: dp``), merged:
    what Hydra puts on top of ``rlvr_base`` when the command line picks no group."""
    chosen = OmegaConf.create()
    for entry in OmegaConf.load(CONFIG_DIR / f"{DEFAULT_CONFIG_NAME}.yaml").defaults:
        if isinstance(entry, DictConfig):
            for group, option in entry.items():
                chosen = OmegaConf.merge(chosen, OmegaConf.load(CONFIG_DIR / str(group) / f"{option}.yaml"))
    return OmegaConf.to_container(chosen)


def compose_default(base: dict, overrides: Sequence[str]) -> DictConfig | None:
    """What :func:`compose` returns for ``ppo_trainer`` without a config folder, built without Hydra's
    compose (it saves about 0.1 s of a 0.45 s config load), or None when the overrides need
    Hydra: a config group, a package, ``+key`` (Hydra checks the key is new), ``~key`` or list
    appends. Each override's value is Hydra's own parse (:func:`parse_overrides`) and is set as Hydra
    sets it: ``key=value`` merged onto an existing key of the struct config, ``++key=value`` added or
    merged. An override Hydra would refuse returns None too, so that Hydra's own error is raised.

    ``tests/trainer/config/test_compose_default.py`` holds it equal to Hydra's compose."""
    parsed = parse_overrides(overrides)
    if any(o.package is not None or o.key_or_group in GROUPS or o.key_or_group.startswith("hydra.")
           or o.type.name not in ("CHANGE", "FORCE_ADD") for o in parsed):
        return None
    cfg = OmegaConf.merge(OmegaConf.create(base), _default_groups())  # merge copies the cached dict
    OmegaConf.set_struct(cfg, True)
    for override in parsed:
        try:
            OmegaConf.update(cfg, override.key_or_group, override.value(), merge=True,
                             force_add=override.is_force_add())
        except Exception:  # noqa: BLE001 - Hydra composes again and raises its own error
            return None
    return cfg


def _first_line(err: Exception) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return " ".join(lines[:3]) if lines else type(err).__name__


def _failed_key(err: Exception) -> str:
    """The dotted key an OmegaConf error under Hydra's names, else ``config``."""
    cause = err.__cause__
    while cause is not None:
        key = getattr(cause, "full_key", None)
        if key:
            return str(key)
        cause = cause.__cause__
    return "config"
