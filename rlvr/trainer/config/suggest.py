""""Did you mean ...?" for a misspelt config key or value (standard library only: runs before torch)."""

from __future__ import annotations

import dataclasses
import difflib
import typing
from collections.abc import Iterable

from rlvr.trainer.config.schema import RlvrConfig


def schema_keys(cls: type = RlvrConfig, prefix: str = "") -> list[str]:
    """Every dotted leaf key of the schema, e.g. ``"data.train_batch_size"``."""
    keys: list[str] = []
    hints = typing.get_type_hints(cls)
    for fld in dataclasses.fields(cls):
        hint = hints[fld.name]
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            keys += schema_keys(hint, f"{prefix}{fld.name}.")
        else:
            keys.append(f"{prefix}{fld.name}")
    return keys


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` with the choice closest to ``word``, or ``""`` when none is close."""
    found = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=0.6)
    return f" (did you mean {found[0]!r}?)" if found else ""


def suggest_key(key: str) -> str:
    """A hint for an unknown dotted key: the same name in other sections, else the closest name in
    the same section, else the closest key or section anywhere."""
    keys = schema_keys()
    parent, _, leaf = key.rpartition(".")
    same_leaf = [k for k in keys if k.rpartition(".")[2] == leaf]
    if same_leaf:
        return f" (did you mean {' or '.join(repr(k) for k in same_leaf[:3])}?)"
    sections = {k[:i] for k in keys for i, char in enumerate(k) if char == "."}
    siblings = [k for k in [*keys, *sections] if k.rpartition(".")[0] == parent]
    found = difflib.get_close_matches(leaf, [k.rpartition(".")[2] for k in siblings], n=1, cutoff=0.6)
    if found:
        return f" (did you mean {f'{parent}.{found[0]}' if parent else found[0]!r}?)"
    return did_you_mean(key, [*keys, *sorted(sections)])
