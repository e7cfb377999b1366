"""One registry type for every extension point (estimators, losses, reward managers, scorers, engines).

A registry maps a name to one object with one signature. Registering a name twice is an error,
and looking up an unknown name raises a ``KeyError`` that lists every valid name, so a typo in a
config fails with a message that says what to write instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """A named table of extension objects.

    Args:
        kind: what the entries are, used in error messages (e.g. ``"advantage estimator"``).
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator that adds the decorated object under ``name``; a duplicate name raises."""

        def add(obj: T) -> T:
            self.add(name, obj)
            return obj

        return add

    def add(self, name: str, obj: T) -> None:
        """Add ``obj`` under ``name``; raises ``ValueError`` if the name is taken."""
        key = str(name)
        if key in self._entries:
            raise ValueError(
                f"{self.kind} {key!r} is already registered (by {self._entries[key]!r}); "
                f"pick another name"
            )
        self._entries[key] = obj

    def get(self, name: str) -> T:
        """Return the entry for ``name``; an unknown name raises ``KeyError`` listing the valid ones."""
        key = str(name)
        if key not in self._entries:
            raise KeyError(
                f"unknown {self.kind} {key!r}; valid names: {', '.join(sorted(self._entries))}"
            )
        return self._entries[key]

    def names(self) -> list[str]:
        """Sorted list of the registered names."""
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return str(name) in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)
