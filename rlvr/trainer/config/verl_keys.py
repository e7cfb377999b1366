"""The status of every verl 0.9 config key in rlvr, for ``docs/verl_compat.md`` and its test.

:func:`key_status` says what rlvr does with a dotted verl key: ``honoured`` (a schema field),
``alias`` (verl's other name of one), ``same`` (rlvr does it by its own means), ``derived`` (verl
copies it from another key), ``note`` (a speed switch with no effect here: a start-up note),
``refused`` (rlvr runs its inert values only; others are refused with the reason) or ``pending``
(another issue builds it). ``scripts/verl_key_table.py`` writes the table from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlvr.trainer.config.verl_pending import ANY, pending_rule
from rlvr.trainer.config.verl_rules import alias_for, rule_for
from rlvr.trainer.config.verl_translate import TARGET_KEY


@dataclass(frozen=True)
class KeyStatus:
    """What rlvr does with one verl key: ``status`` (see the module docstring) and a note."""

    status: str
    note: str


def _inert(values: tuple) -> str:
    return " / ".join("any value" if v is ANY else repr(v) for v in values)


def key_status(key: str, schema_help: dict[str, str], schema_defaults: dict[str, Any],
               verl_default: Any = None, free_dicts: frozenset[str] = frozenset()) -> KeyStatus | None:
    """The status of ``key`` (None: rlvr does not know the key, a gap the doc test reports).

    Args:
        key: a dotted verl key.
        schema_help: help text of every schema leaf.
        schema_defaults: default of every schema leaf.
        verl_default: verl's default value (for the note when rlvr's differs).
        free_dicts: the schema's free-form dict fields (their entries are values).
    """
    pending = pending_rule(key)
    if pending is not None:
        accepted = f"; accepted today at {_inert(pending.inert)}" if pending.inert else ""
        gate = f"; accepted while {pending.gate[0]} is {_inert(pending.gate[1])}" if pending.gate else ""
        return KeyStatus(f"pending: issue {pending.issue}", f"{pending.feature}{accepted}{gate}")
    if key.rpartition(".")[2] == TARGET_KEY:
        return KeyStatus("same", "verl's class of the section: rlvr types every section itself (a class of your "
                                 "own is refused)")
    rule = rule_for(key)
    free = next((name for name in free_dicts if key.startswith(f"{name}.")), None)
    if free is not None and rule is None and pending_rule(key) is None:
        return KeyStatus("honoured", f"an entry of {free}: {schema_help[free]}")
    if key in schema_help:
        default = schema_defaults.get(key)
        differs = (f" (rlvr's default {default!r}, verl's {verl_default!r})"
                   if verl_default is not None and default != verl_default and "${" not in str(verl_default)
                   and "${" not in str(default) else "")
        return KeyStatus("honoured", schema_help[key] + differs)
    alias = alias_for(key)
    if alias is not None:
        target = alias[1]
        while target not in schema_help and alias_for(target) is not None:
            target = alias_for(target)[1]
        if target in schema_help:
            return KeyStatus("alias", f"verl's name of {target}")
        found = key_status(target, schema_help, schema_defaults, verl_default, free_dicts)
        return None if found is None else KeyStatus(found.status, f"(as {target}) {found.note}")
    if rule is None:
        return None
    if rule.kind == "refused":
        gate = f" (any value while {rule.gate[0]} is {_inert(rule.gate[1])})" if rule.gate else ""
        accepted = f"accepted at {_inert(rule.inert)}{gate}" if rule.inert else f"accepted{gate}"
        return KeyStatus("refused", f"{accepted}; other values refused: {rule.reason}")
    if rule.kind == "note":
        quiet = f"; no note at {_inert(rule.inert)}" if rule.inert else ""
        gate = f"; no note while {rule.gate[0]} is {_inert(rule.gate[1])}" if rule.gate else ""
        return KeyStatus("note", f"no effect: {rule.reason}{quiet}{gate}")
    return KeyStatus(rule.kind, rule.reason)
