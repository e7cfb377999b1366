"""One registry type for every extension point (estimators, losses, reward managers, scorers, engines).

A registry is a ``dict`` from a name to one object with one signature, so code written for verl's
plain-dict registries works unchanged: ``name in REGISTRY``, ``REGISTRY[name]``, ``.update()``,
``.clear()``, ``.items()``. On top of the dict:

- the :meth:`Registry.register` decorator rejects a name that is already taken by another object
  (registering the same object again is a no-op, so re-importing a module is harmless);
- a lookup of an unknown name raises :class:`RegistryKeyError`, whose message lists every valid
  name, so a typo in a config fails with a message that says what to write instead;
- an entry may carry metadata (what it needs from the trainer, e.g. a critic), a frozen dataclass
  given at registration and read back with :meth:`Registry.metadata`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")

__all__ = ["Registry", "RegistryKeyError"]


class RegistryKeyError(KeyError, ValueError):
    """An unknown registry name. A ``KeyError`` (dict lookup) and a ``ValueError`` (what verl's
    ``get_*_fn`` helpers raise); ``str()`` is the plain message, without ``KeyError``'s quotes."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class Registry(dict, Generic[T]):
    """A named table of extension objects.

    Args:
        kind: what the entries are, used in error messages (e.g. ``"advantage estimator"``).
        metadata_type: a dataclass whose fields an entry may set at registration
            (``register(name, **fields)``); entries registered without it, or put in directly with
            ``registry[name] = obj``, get ``metadata_type()``. None: entries carry no metadata.
    """

    def __init__(self, kind: str, metadata_type: type | None = None) -> None:
        super().__init__()
        self.kind = kind
        self.metadata_type = metadata_type
        self._metadata: dict[str, tuple[Any, Any]] = {}

    def register(self, name: str, **metadata: Any) -> Callable[[T], T]:
        """Decorator that adds the decorated object under ``name`` (see :meth:`add`)."""

        def add(obj: T) -> T:
            self.add(name, obj, **metadata)
            return obj

        return add

    def add(self, name: str, obj: T, **metadata: Any) -> None:
        """Add ``obj`` under ``name`` with optional metadata fields; adding the object that is
        already registered under ``name`` again changes nothing.

        Raises:
            ValueError: ``name`` is taken by another object.
            TypeError: metadata this registry does not define.
        """
        key = str(name)
        if key in self:
            if self[key] is obj:
                return
            raise ValueError(f"{self.kind} {key!r} is already registered (by {self[key]!r}); pick another name")
        if metadata and self.metadata_type is None:
            raise TypeError(f"{self.kind} entries carry no metadata; got {sorted(metadata)}")
        entry_metadata = self.metadata_type(**metadata) if self.metadata_type is not None else None
        self[key] = obj
        self._metadata[key] = (obj, entry_metadata)

    def __missing__(self, name: str) -> T:
        raise RegistryKeyError(f"unknown {self.kind} {name!r}; valid names: {', '.join(self.names())}")

    def get(self, name: str, *default: Any) -> T:
        """The entry for ``name``. An unknown name raises :class:`RegistryKeyError` listing the
        valid ones, unless a ``default`` is given (then it is returned, as ``dict.get`` does)."""
        if default and str(name) not in self:
            return default[0]
        return self[str(name)]

    def metadata(self, name: str) -> Any:
        """The metadata of the entry ``name`` (``metadata_type()`` when it was registered without
        any); an unknown name raises :class:`RegistryKeyError`."""
        obj = self[str(name)]
        registered, entry_metadata = self._metadata.get(str(name), (None, None))
        if registered is obj and entry_metadata is not None:
            return entry_metadata
        return self.metadata_type() if self.metadata_type is not None else None

    def names(self) -> list[str]:
        """Sorted list of the registered names."""
        return sorted(self)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()})"
