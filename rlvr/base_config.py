"""verl's ``verl.base_config.BaseConfig``: a dataclass config that reads like a read-only mapping."""

from __future__ import annotations

import collections.abc
from dataclasses import FrozenInstanceError, dataclass, fields
from typing import Any, ClassVar

__all__ = ["BaseConfig"]


@dataclass
class BaseConfig(collections.abc.Mapping):
    """Base of dataclass configs: ``config["key"]``, ``config.get("key", default)``, iteration over
    the field names and ``len``; a field, once set, cannot be assigned again unless it is listed in
    the class's ``_mutable_fields``.

    Raises:
        FrozenInstanceError: assigning a set field that is not mutable.
        AttributeError / TypeError: ``config[key]`` of a missing attribute / a key that is not a string.
    """

    _mutable_fields: ClassVar[set[str]] = set()
    _target_: str = ""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self.__dict__ and name not in type(self)._mutable_fields:
            raise FrozenInstanceError(f"Field '{name}' is frozen and cannot be modified (add it to _mutable_fields "
                                      "to allow it)")
        super().__setattr__(name, value)

    def get(self, key: str, default: Any = None) -> Any:
        """The attribute ``key``, or ``default`` when there is none."""
        return getattr(self, key, default)

    def __getitem__(self, key: str) -> Any:
        return getattr(self, key)

    def __iter__(self):
        return (f.name for f in fields(self))

    def __len__(self) -> int:
        return len(fields(self))
