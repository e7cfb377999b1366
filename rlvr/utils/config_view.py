"""Read a verl-shaped config with rlvr's defaults: :func:`config_view`.

Functions at verl's module paths take a ``config`` argument (the algorithm section, the actor
section, the run config) that verl users build themselves: a dataclass, a dict, an OmegaConf node
or a ``SimpleNamespace`` holding verl's keys only. rlvr's own options (``singleton_advantage``,
``global_batch_info``, ``reward_model.on_error``, ...) are missing there; a view reads every field
of the schema dataclass from ``config`` when it has it and from the schema's default otherwise.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

__all__ = ["ConfigView", "config_view"]

_ABSENT = object()


@functools.cache
def _schema_fields(schema: type) -> dict[str, tuple[dataclasses.Field, type | None]]:
    """Field name -> ``(field, nested dataclass type or None)`` of the dataclass ``schema``."""
    hints = typing.get_type_hints(schema)
    fields = {}
    for field in dataclasses.fields(schema):
        hint = hints[field.name]
        fields[field.name] = (field, hint if isinstance(hint, type) and dataclasses.is_dataclass(hint) else None)
    return fields


def _default(field: dataclasses.Field) -> Any:
    return field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default


def _read(config: Any, name: str) -> Any:
    """``config``'s value for ``name``, or ``_ABSENT``."""
    if config is None:
        return _ABSENT
    if isinstance(config, Mapping | DictConfig):
        return config[name] if name in config else _ABSENT
    return getattr(config, name, _ABSENT)


class ConfigView:
    """``config`` seen through the dataclass ``schema`` (see :func:`config_view`)."""

    __slots__ = ("_config", "_schema")

    def __init__(self, config: Any, schema: type) -> None:
        object.__setattr__(self, "_config", config)
        object.__setattr__(self, "_schema", schema)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)  # copy/pickle protocol lookups are not config keys
        value = _read(self._config, name)
        field = _schema_fields(self._schema).get(name)
        if field is None:
            if value is _ABSENT:
                raise AttributeError(f"{self._schema.__name__} has no field {name!r} and the config has no such key")
            return value
        schema_field, nested = field
        if nested is not None:
            return config_view(None if value is _ABSENT else value, nested)
        return _default(schema_field) if value is _ABSENT else value

    def get(self, name: str, default: Any = None) -> Any:
        """``dict.get``-style access (verl code calls ``config.get(key, default)``)."""
        try:
            return getattr(self, name)
        except AttributeError:
            return default

    def __contains__(self, name: str) -> bool:
        return name in _schema_fields(self._schema) or _read(self._config, name) is not _ABSENT

    def __repr__(self) -> str:
        return f"ConfigView({self._schema.__name__}, {self._config!r})"


def config_view(config: Any, schema: type) -> Any:
    """``config`` read as the schema dataclass ``schema``: a field that ``config`` lacks has the
    schema's default, a nested section is viewed the same way, and keys outside the schema are
    passed through. ``config`` may be an instance of ``schema`` or an OmegaConf node typed with
    it (returned as they are: they have every field), another dataclass, a dict, an OmegaConf
    node, an object with attributes, or None (every default)."""
    if isinstance(config, schema):
        return config
    if isinstance(config, DictConfig) and OmegaConf.get_type(config) is schema:
        return config
    return ConfigView(config, schema)
