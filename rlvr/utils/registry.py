"""One registry type for every extension point (estimators, losses, reward managers, scorers, engines).

A registry is a ``dict`` from a name to one object with one signature, so code written for verl's
plain-dict registries works unchanged: ``name in REGISTRY``, ``REGISTRY[name]``, ``.update()``,
``.clear()``, ``.items()``. On top of the dict:

- the :meth:`Registry.register` decorator rejects a name that is already taken by another object.
  Registering the same object again changes nothing, and registering an object with the same
  module and qualified name as the registered one replaces it (a debug log says so): a module
  imported twice, in two processes or under ``importlib.reload``, is harmless;
- a lookup of an unknown name raises :class:`RegistryKeyError`, whose message lists every valid
  name (and, starting with verl's words, ``Unknown <kind>: <name>``), so a typo in a config fails
  with a message that says what to write instead;
- wherever a name is looked up, an object path ``pkg.module:Name`` (or ``file.py:Name``) works
  too: the object is imported on demand (:func:`rlvr.utils.user_code.load_object`) in the process
  that looks it up. An object registered under some name in its module brings that entry's
  metadata; another object is checked by the registry's ``coerce`` (callable by default);
- an entry may carry metadata (what it needs from the trainer, e.g. a critic), a frozen dataclass
  given at registration and read back with :meth:`Registry.metadata`;
- every registry is known to :func:`all_registries`, so that the names a process registered of its
  own reach the worker processes (:mod:`rlvr.utils.registrations`). A name the driver sent that a
  worker could not load is noted (:meth:`Registry.note_unloadable`) and its reason is part of the
  message of a lookup of that name.
"""

from __future__ import annotations

import itertools
import logging
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from rlvr.utils.user_code import UserCodeError, is_object_path, load_object

T = TypeVar("T")

__all__ = ["Registry", "RegistryKeyError", "all_registries", "lookup_in", "register_in", "same_origin"]

logger = logging.getLogger(__name__)

_INSTANCES: weakref.WeakValueDictionary[int, Registry] = weakref.WeakValueDictionary()
_NUMBERS = itertools.count()


def all_registries() -> list[Registry]:
    """Every registry that exists in this process, in the order they were made."""
    return [registry for _, registry in sorted(_INSTANCES.items())]


class RegistryKeyError(KeyError, ValueError):
    """An unknown registry name. A ``KeyError`` (dict lookup) and a ``ValueError`` (what verl's
    ``get_*_fn`` helpers raise); ``str()`` is the plain message, without ``KeyError``'s quotes."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def _origin(obj: Any) -> tuple[str, str] | None:
    """``(module, qualified name)`` of a function or class; None for other objects."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    return (module, qualname) if isinstance(module, str) and isinstance(qualname, str) else None


def same_origin(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` are the same definition: the same object, or functions / classes
    with the same module and qualified name (one module executed twice)."""
    return a is b or (_origin(a) is not None and _origin(a) == _origin(b))


def _callable_entry(obj: Any) -> Any:
    if not callable(obj):
        raise TypeError(f"{obj!r} (a {type(obj).__name__}) is not a function or class")
    return obj


class Registry(dict, Generic[T]):
    """A named table of extension objects.

    Args:
        kind: what the entries are, used in error messages (e.g. ``"advantage estimator"``).
        metadata_type: a dataclass whose fields an entry may set at registration
            (``register(name, **fields)``); entries registered without it, or put in directly with
            ``registry[name] = obj``, get ``metadata_type()``. None: entries carry no metadata.
        identity: the function or class that identifies an entry, for the re-registration rule
            and for finding the entry of an object loaded by path (default: the entry itself).
        coerce: turns an object loaded by path that is not registered here into an entry, raising
            ``TypeError`` (saying why) when it does not fit (default: it must be callable).
        verl_miss: verl's own wording of a miss (a format string with ``{name}``), added to the
            message where it differs from ``Unknown <kind>: <name>``.
        object_paths: whether a ``pkg.module:Name`` lookup loads an object (off for registries
            whose own names contain colons, such as IFEval's ``keywords:existence``).
    """

    def __init__(self, kind: str, metadata_type: type | None = None, *, identity: Callable[[T], Any] | None = None,
                 coerce: Callable[[Any], T] | None = None, verl_miss: str | None = None,
                 object_paths: bool = True) -> None:
        super().__init__()
        self.kind = kind
        self.metadata_type = metadata_type
        self._identity = identity or (lambda entry: entry)
        self._coerce = coerce or _callable_entry
        self._verl_miss = verl_miss
        self.object_paths = object_paths
        self._metadata: dict[str, tuple[Any, Any]] = {}
        self._unloadable: dict[str, str] = {}
        _INSTANCES[next(_NUMBERS)] = self

    def register(self, name: str, **metadata: Any) -> Callable[[T], T]:
        """Decorator that adds the decorated object under ``name`` (see :meth:`add`)."""

        def add(obj: T) -> T:
            self.add(name, obj, **metadata)
            return obj

        return add

    def add(self, name: str, obj: T, **metadata: Any) -> None:
        """Add ``obj`` under ``name`` with optional metadata fields. Adding the registered object
        again changes nothing; an object with the registered one's module and qualified name
        replaces it (see the module docstring).

        Raises:
            ValueError: ``name`` is taken by another object.
            TypeError: metadata this registry does not define.
        """
        key = str(name)
        if metadata and self.metadata_type is None:
            raise TypeError(f"{self.kind} entries carry no metadata; got {sorted(metadata)}")
        if key in self:
            old = self[key]
            if old is obj:
                return
            if not same_origin(self._identity(old), self._identity(obj)):
                raise ValueError(f"{self.kind} {key!r} is already registered (by {old!r}); pick another name")
            logger.debug("%s %r: replacing %r with %r of the same module and name (module imported again)",
                         self.kind, key, old, obj)
        entry_metadata = self.metadata_type(**metadata) if self.metadata_type is not None else None
        self[key] = obj
        self._metadata[key] = (obj, entry_metadata)

    def miss_message(self, name: Any, names: list[str] | None = None) -> str:
        """The message of a lookup of the unknown ``name``: verl's words, then the valid names
        (this registry's, or ``names``)."""
        valid = self.names() if names is None else names
        message = f"Unknown {self.kind}: {name}; valid names: {', '.join(valid) or '(none registered)'}"
        if self._verl_miss is not None:
            message += f" (verl: {self._verl_miss.format(name=name)})"
        if str(name) in self._unloadable:
            message += f". The driver registered {name!r}, but this process could not load it: {self._unloadable[str(name)]}"
        return message

    def identity_of(self, entry: T) -> Any:
        """The function or class that identifies ``entry`` (the entry itself, unless the registry
        was made with an ``identity``)."""
        return self._identity(entry)

    def note_unloadable(self, name: str, reason: str) -> None:
        """Record that the entry ``name`` another process registered could not be loaded here, and why
        (a lookup of ``name`` then says so)."""
        self._unloadable[str(name)] = reason

    def registered_metadata(self, name: str) -> Any:
        """The metadata ``name`` was registered with (None: none, or put in with ``registry[name] = obj``)."""
        key = str(name)
        registered, entry_metadata = self._metadata.get(key, (None, None))
        return entry_metadata if key in self and registered is self[key] else None

    def _is_path(self, name: Any) -> bool:
        return self.object_paths and is_object_path(name)

    def __missing__(self, name: str) -> T:
        if self._is_path(name):
            return self._load(name)[1]
        raise RegistryKeyError(self.miss_message(name))

    def _load(self, path: str) -> tuple[str | None, T]:
        """``(registered name or None, entry)`` of the object at ``path``."""
        try:
            obj = load_object(path)
        except UserCodeError as err:
            raise RegistryKeyError(f"cannot load the {self.kind} {path!r}: {err}") from err
        for name, entry in self.items():
            if self._identity(entry) is obj:
                return name, entry
        try:
            return None, self._coerce(obj)
        except TypeError as err:
            raise RegistryKeyError(f"{path!r} is not a {self.kind}: {err}") from err

    def has(self, name: Any) -> bool:
        """Whether ``name`` is registered, or is an object path that loads into an entry."""
        if str(name) in self:
            return True
        if not self._is_path(name):
            return False
        try:
            self._load(name)
        except RegistryKeyError:
            return False
        return True

    def get(self, name: str, *default: Any) -> T:
        """The entry for ``name`` (a registered name or an object path). An unknown name raises
        :class:`RegistryKeyError` listing the valid ones, unless a ``default`` is given (then it
        is returned, as ``dict.get`` does)."""
        if default and not self.has(name):
            return default[0]
        return self[str(name)]

    def metadata(self, name: str) -> Any:
        """The metadata of the entry ``name`` (``metadata_type()`` when it was registered without
        any; an object path brings the metadata of the name it is registered under); an unknown
        name raises :class:`RegistryKeyError`."""
        key = str(name)
        if key not in self and self._is_path(key):
            key = self._load(key)[0] or key
        obj = self[key]
        registered, entry_metadata = self._metadata.get(key, (None, None))
        if registered is obj and entry_metadata is not None:
            return entry_metadata
        return self.metadata_type() if self.metadata_type is not None else None

    def names(self) -> list[str]:
        """Sorted list of the registered names."""
        return sorted(self)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()})"


def register_in(table: dict, name: str, obj: Any, like: Registry, **metadata: Any) -> None:
    """``table.add(name, obj, **metadata)`` for a :class:`Registry`; for a plain ``dict`` (verl's
    tests put one in place of a module's registry) the same rule without metadata, with the
    messages of ``like``, the registry it stands in for."""
    if isinstance(table, Registry):
        table.add(name, obj, **metadata)
        return
    if name in table and table[name] is not obj and not same_origin(table[name], obj):
        raise ValueError(f"{like.kind} {name!r} is already registered (by {table[name]!r}); pick another name")
    table[name] = obj


def lookup_in(table: dict, name: str, like: Registry) -> Any:
    """``table[name]`` for a :class:`Registry` (object paths included); for a plain ``dict`` the
    entry, or a :class:`RegistryKeyError` with the messages of ``like`` listing ``table``'s names."""
    if isinstance(table, Registry):
        return table[name]
    if name not in table:
        raise RegistryKeyError(like.miss_message(name, sorted(table)))
    return table[name]
