"""Load a tool's typed config (SFT trainer, offline evaluation) the way verl's Hydra entry points take
theirs, torch-free: the schema's defaults, then a user YAML (``--config-path`` / ``--config-name``),
then the command line's overrides, parsed by Hydra's own override grammar (``key=value``,
``+key=value``, ``++key=value``, lists, quoted strings).

verl's config-group selections (``engine=fsdp``) are checked against the groups a tool has, each
with the one option rlvr runs; a YAML's ``defaults`` list may name the tool's verl base config.
Unknown keys are refused with a suggestion, values of the wrong type with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from rlvr.trainer.config.suggest import did_you_mean, schema_keys
from rlvr.utils.errors import ConfigError

__all__ = ["load_structured_config"]


class _Loader:
    def __init__(self, schema: type, tool: str, groups: Mapping[str, str], base_names: Sequence[str]) -> None:
        self.schema, self.tool, self.groups, self.base_names = schema, tool, groups, base_names

    def group(self, key: str, option: Any, origin: str) -> None:
        if option != self.groups[key]:
            raise ConfigError(key, f"verl's {key} config {option!r} (from {origin}) is not available in rlvr's "
                              f"{self.tool}: use {key}={self.groups[key]} (the default)")

    def update(self, cfg: DictConfig, key: str, value: Any, origin: str) -> None:
        try:
            OmegaConf.update(cfg, key, value, merge=True)
        except (ConfigKeyError, ConfigAttributeError):
            raise ConfigError(key, f"unknown key (from {origin}){did_you_mean(key, schema_keys(self.schema))}; "
                              "--help-config lists every key") from None
        except OmegaConfBaseException as err:
            raise ConfigError(key, f"wrong value (from {origin}): {str(err).splitlines()[0]}") from None

    def compose_yaml(self, cfg: DictConfig, path: Path) -> None:
        if not path.is_file():
            raise ConfigError("--config-name", f"{path} does not exist")
        layer = OmegaConf.load(path)
        for entry in layer.pop("defaults", None) or []:
            if isinstance(entry, str):
                if entry.lstrip("/") not in ("_self_", *self.base_names):
                    raise ConfigError("defaults", f"{path}: the defaults entry {entry!r} is not a config rlvr's "
                                      f"{self.tool} knows ({', '.join(self.base_names)} and _self_ are)")
                continue
            for group, option in entry.items():
                name = str(group).split("@")[-1].lstrip("/")
                if name not in self.groups:
                    raise ConfigError("defaults", f"{path}: {self.tool} has no config group {name!r}")
                self.group(name, option, str(path))
        for key, value in _leaves(layer):
            self.update(cfg, key, value, str(path))


def _leaves(node: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(node, DictConfig) and len(node) > 0:
        return [item for key, value in node.items_ex(resolve=False) for item in _leaves(value, f"{prefix}{key}.")]
    return [(prefix.rstrip("."), OmegaConf.to_container(node) if isinstance(node, (DictConfig, ListConfig)) else node)]


def load_structured_config(schema: type, overrides: Sequence[str] = (), config_file: str | Path | None = None, *,
                           tool: str, groups: Mapping[str, str] | None = None,
                           base_names: Sequence[str] = ()) -> DictConfig:
    """The config of ``schema`` (a dataclass): defaults, then ``config_file``, then ``overrides``.

    Args:
        tool: the tool's name, for messages.
        groups: verl's config groups of the tool and the one option of each rlvr runs.
        base_names: names of verl's base config a YAML's ``defaults`` may list.

    Raises:
        ConfigError: an unknown key (with a suggestion), a value of the wrong type, an unparsable
            override, a ``~key`` deletion, or a config group rlvr does not have.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    loader = _Loader(schema, tool, groups or {}, base_names)
    cfg = OmegaConf.structured(schema)
    if config_file is not None:
        loader.compose_yaml(cfg, Path(config_file))
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException as err:
        raise ConfigError("command line", f"cannot parse the overrides: {str(err).splitlines()[0]}") from None
    for item in parsed:
        key = item.key_or_group
        if item.is_delete():
            raise ConfigError(key, "~key removes a key, but every key of this config has a meaning; set its value")
        if key in loader.groups:
            loader.group(key, item.value(), "the command line")
            continue
        loader.update(cfg, key, item.value(), "the command line")
    return cfg
