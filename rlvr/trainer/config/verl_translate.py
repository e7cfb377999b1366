"""Turn a composed config that may hold verl 0.9 keys into one that rlvr's schema types (OmegaConf
only: the command runs it before torch).

For every dotted leaf that is not a schema field: verl's ``_target_`` class names are dropped (rlvr
types each section itself), aliases move their value to the schema field
(:data:`~rlvr.trainer.config.verl_rules.ALIASES`), pending keys are accepted or refused naming their
issue (:mod:`~rlvr.trainer.config.verl_pending`), and rule keys are checked and dropped, with a
start-up note for a speed switch that has no effect here (:data:`~rlvr.trainer.config.verl_rules.RULES`).
What is left is checked by the typed merge (an unknown key is reported with "did you mean").
A string given for a list field becomes a one-item list (verl's ``trainer.logger=console``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlvr.trainer.config.verl_pending import pending_refusal, pending_rule
from rlvr.trainer.config.verl_rules import VALUE_ALIASES, alias_for, gate_off, rule_for
from rlvr.utils.errors import ConfigError

logger = logging.getLogger("rlvr.config")
TARGET_KEY = "_target_"
TARGET_PACKAGES = ("verl.", "rlvr.")


@dataclass(frozen=True)
class SchemaShape:
    """What the translation needs to know of the schema.

    Attributes:
        leaves: dotted leaf keys of the schema.
        free_dicts: dotted keys of the schema's free-form dict fields (their contents are values).
        lists: dotted keys of the list fields.
        defaults: schema default of every leaf (interpolations unresolved).
        helps: help text of every leaf.
        bools: the bool fields; optionals: the fields that may be None (verl's empty value ``key=``
            of an unset shell variable is False / None there, as verl's falsy checks read it).
    """

    leaves: frozenset[str]
    free_dicts: frozenset[str]
    lists: frozenset[str]
    defaults: dict[str, Any]
    helps: dict[str, str]
    bools: frozenset[str] = frozenset()
    optionals: frozenset[str] = frozenset()


def _flatten(node: Any, shape: SchemaShape, prefix: str = "") -> dict[str, Any]:
    """Dotted leaf -> raw value; a free-form dict field or an empty dict is one leaf."""
    if not isinstance(node, dict) or not node or prefix.rstrip(".") in shape.free_dicts:
        return {prefix.rstrip("."): node}
    out: dict[str, Any] = {}
    for key, value in node.items():
        out.update(_flatten(value, shape, f"{prefix}{key}."))
    return out


def unflatten(leaves: dict[str, Any]) -> dict[str, Any]:
    """Dotted leaves (``{"a.b.c": 1}``) as nested dicts (``{"a": {"b": {"c": 1}}}``)."""
    root: dict[str, Any] = {}
    for key, value in leaves.items():
        node = root
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return root


def _resolved(composed: DictConfig, key: str, raw: Any) -> Any:
    """The key's value with interpolations resolved (the raw value where they cannot be)."""
    if not (isinstance(raw, str) and "${" in raw):
        return raw
    try:
        value = OmegaConf.select(composed, key, throw_on_missing=False)
    except Exception:  # noqa: BLE001 - an interpolation that names a removed key keeps its raw text
        return raw
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def _move_aliases(leaves: dict[str, Any], values: dict[str, Any], shape: SchemaShape) -> None:
    """Move each alias's value to its schema key (in ``leaves`` and ``values``)."""
    for key in [k for k in leaves if k not in shape.leaves]:
        found = alias_for(key)
        if found is None:
            continue
        alias, target = found
        raw, value = leaves.pop(key), values.pop(key)
        while target not in shape.leaves and alias_for(target) is not None:  # verl's name of verl's name
            alias, target = alias_for(target)
        if target not in shape.leaves:  # a subtree leaf that a rule (not a schema field) covers
            leaves[target], values[target] = raw, value
            continue
        default = shape.defaults.get(target) if alias.subtree else alias.default
        if value == default or (alias.convert == "true_only" and value is not True):
            continue
        converted = max(int(value), 0) if alias.convert == "warmup" else value
        current = values.get(target, shape.defaults.get(target))
        if current != shape.defaults.get(target) and current != converted:
            raise ConfigError(key, f"is verl's name of {target}, which is set to {current!r}; give one value, "
                              f"under one of the two names")
        leaves[target] = values[target] = converted


def _apply_rule(key: str, value: Any, values: dict[str, Any], shape: SchemaShape, notes: list[str]) -> bool:
    """Check a non-schema leaf; True when it is a verl key rlvr accepts (then dropped)."""
    if key.rpartition(".")[2] == TARGET_KEY:
        if not (isinstance(value, str) and value.startswith(TARGET_PACKAGES)):
            raise ConfigError(key, f"{value!r}: rlvr builds every section as its own typed config, not from a "
                              "class of yours; remove _target_ (register code with trainer.user_modules)")
        return True
    if pending_rule(key) is not None:
        refusal = pending_refusal(key, value, values)
        if refusal:
            raise ConfigError(key, f"{value!r}: {refusal}")
        return True
    rule = rule_for(key)
    if rule is None:
        return False
    if rule.kind == "derived":
        source = values.get(rule.source, shape.defaults.get(rule.source))
        if value != source:
            raise ConfigError(key, f"{value!r}: {rule.reason}; set {rule.source} (now {source!r}) instead")
    elif rule.kind in ("note", "refused") and not (gate_off(rule.gate, values) or value in rule.inert):
        if rule.kind == "refused":
            raise ConfigError(key, f"{value!r} is not supported: {rule.reason}")
        notes.append(f"{key}={value!r} has no effect in rlvr: {rule.reason}")
    return True


def _check_free_dict(key: str, value: Any, values: dict[str, Any], shape: SchemaShape, notes: list[str]) -> Any:
    """A free-form dict's entries that are verl keys of a rule or of another issue (e.g. the attention
    backend in ``override_transformer_config``; verl's ``_target_`` inside the entries of a typed dict
    such as ``distillation.teacher_models``), at any depth: checked and dropped; the others are kept."""
    if not isinstance(value, dict) or pending_rule(key) is not None:  # a schema dict inside a pending section
        return value
    return {name: _check_free_dict(f"{key}.{name}", item, values, shape, notes) for name, item in value.items()
            if not _apply_rule(f"{key}.{name}", item, values, shape, notes)}


def translate(composed: DictConfig, shape: SchemaShape) -> tuple[dict[str, Any], list[str]]:
    """The composed config as a plain dict for the typed merge, and the start-up notes.

    Raises:
        ConfigError: a refused value (the key and what to do), a pending feature (its issue), an
            alias that contradicts its schema key, or a ``_target_`` that names a class of the user's.
    """
    plain = OmegaConf.to_container(composed, resolve=False)
    leaves = _flatten(plain, shape)
    values = {key: _resolved(composed, key, raw) for key, raw in leaves.items()}
    _move_aliases(leaves, values, shape)
    notes: list[str] = []
    for key in list(leaves):
        if key in shape.free_dicts:
            leaves[key] = _check_free_dict(key, leaves[key], values, shape, notes)
        elif key in VALUE_ALIASES and values[key] in VALUE_ALIASES[key]:
            leaves[key], note = VALUE_ALIASES[key][values[key]]
            if note:
                notes.append(f"{key}={values[key]!r}: {note}")
        elif leaves[key] == "" and (key in shape.bools or key in shape.optionals):
            leaves[key] = False if key in shape.bools else None
        elif key in shape.lists and isinstance(leaves[key], str) and "${" not in leaves[key]:
            leaves[key] = [leaves[key]]
        elif key not in shape.leaves and _apply_rule(key, values[key], values, shape, notes):
            del leaves[key]
    for note in notes:
        logger.warning("note: %s", note)
    return unflatten(leaves), notes
