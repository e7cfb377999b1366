"""Small python helpers shared across rlvr."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rlvr.utils.errors import ProtocolError, ProtocolKeyError

__all__ = ["DynamicEnum", "append_to_dict"]


def append_to_dict(data: dict[str, Any], new_data: dict[str, Any], prefix: str = "") -> None:
    """Collect metric values per name, in place: ``data[prefix + key]`` gets each value of
    ``new_data`` appended (a list is extended; a key already starting with ``prefix`` keeps its name).
    A :class:`~rlvr.utils.metric.Metric` value starts a ``Metric`` of its aggregation rather than a list.
    """
    from rlvr.utils.metric import Metric  # imported here: this module stays torch-free for the config check

    for key, value in new_data.items():
        name = key if key.startswith(prefix) else f"{prefix}{key}"
        if name not in data:
            data[name] = value.init_list() if isinstance(value, Metric) else []
        if isinstance(value, list):
            data[name].extend(value)
        else:
            data[name].append(value)


class _DynamicEnumMeta(type):
    """Iteration, ``in``, ``[name]`` and ``len`` over the members of a :class:`DynamicEnum` class."""

    def __iter__(cls) -> Iterator[Any]:
        return iter(list(cls._registry.values()))

    def __contains__(cls, item: Any) -> bool:
        if isinstance(item, str):
            return item.upper() in cls._registry
        return item in cls._registry.values()

    def __getitem__(cls, name: str) -> Any:
        member = cls.from_name(name)
        if member is None:
            raise ProtocolKeyError(f"{cls.__name__} has no member {name.upper()!r}; members: {cls.names()}")
        return member

    def __len__(cls) -> int:
        return len(cls._registry)

    def names(cls) -> list[str]:
        return list(cls._registry)

    def values(cls) -> list[Any]:
        return list(cls._registry.values())


def _enum_member(enum_cls: type[DynamicEnum], name: str) -> DynamicEnum:
    """The member ``name`` of ``enum_cls``, registered first if this process has not registered it
    (unpickling in another process keeps members unique without importing the registering code)."""
    return enum_cls.from_name(name) or enum_cls.register(name)


class DynamicEnum(metaclass=_DynamicEnumMeta):
    """An enum whose members can be added and removed at run time (``register`` / ``remove``).

    Members are attributes of the class (``Dispatch.ONE_TO_ALL``), unique per name, compare by
    identity and pickle by name. Names are upper-cased. Each subclass has its own members.
    """

    _registry: dict[str, DynamicEnum] = {}
    _next_value: int = 0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._registry = {}
        cls._next_value = 0

    def __init__(self, name: str, value: int) -> None:
        self.name = name
        self.value = value

    def __repr__(self) -> str:
        return f"<{type(self).__name__}.{self.name}: {self.value}>"

    def __reduce__(self) -> tuple:
        return _enum_member, (type(self), self.name)

    @classmethod
    def register(cls, name: str) -> DynamicEnum:
        """Add member ``name.upper()`` and return it.

        Raises:
            ProtocolError: the name is taken (a ``ValueError``, as verl raises).
        """
        key = name.upper()
        if key in cls._registry:
            raise ProtocolError(f"{cls.__name__}.{key} is already registered")
        member = cls(key, cls._next_value)
        cls._registry[key] = member
        setattr(cls, key, member)
        cls._next_value += 1
        return member

    @classmethod
    def remove(cls, name: str) -> DynamicEnum:
        """Remove member ``name.upper()`` and return it.

        Raises:
            ProtocolKeyError: there is no such member.
        """
        key = name.upper()
        if key not in cls._registry:
            raise ProtocolKeyError(f"{cls.__name__} has no member {key!r}; members: {cls.names()}")
        delattr(cls, key)
        return cls._registry.pop(key)

    @classmethod
    def from_name(cls, name: str) -> DynamicEnum | None:
        """The member called ``name`` (any case), or None."""
        return cls._registry.get(name.upper())
