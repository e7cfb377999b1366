"""verl 0.9 keys whose feature rlvr is still building in another issue (standard library only).

Each rule names the issue and the feature. A key of a rule that rlvr's schema does not have yet is
accepted only at a value that asks for what rlvr does today (its ``inert`` values, or any value
while the rule's ``gate`` key says the feature is off), and dropped then; any other value is refused
naming the issue. The list shrinks as those issues land: their keys become schema fields.
``docs/verl_compat.md`` marks these keys "pending: issue N".
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

ANY = object()
"""``inert`` value: every value of the key asks for what rlvr does today."""


@dataclass(frozen=True)
class Pending:
    """Keys matching ``pattern`` (``*`` matches across dots) belong to issue ``issue``.

    Attributes:
        pattern: dotted-key glob.
        issue: the rlvr issue that builds the feature.
        feature: what the keys do, in a few words.
        inert: the values that ask for rlvr's behaviour today (accepted and dropped).
        gate: ``(key, off values)``: while ``key`` (a dotted-key glob) has one of the off values or
            is absent, the feature is off and every key of the rule is accepted.
    """

    pattern: str
    issue: int
    feature: str
    inert: tuple = ()
    gate: tuple[str, tuple] | None = None


PENDING: tuple[Pending, ...] = (
    # issue 42: scale settings not built yet
    Pending("actor_rollout_ref.rollout.nnodes", 42, "a standalone rollout pool sized in the rollout section "
            "(rlvr's top-level rollout.nnodes / rollout.n_gpus_per_node size a rollout apart)", (0,)),
    Pending("actor_rollout_ref.rollout.n_gpus_per_node", 42, "a standalone rollout pool sized in the rollout "
            "section (rlvr's top-level rollout.nnodes / rollout.n_gpus_per_node size a rollout apart)", (ANY,)),
    Pending("*.megatron.dynamic_context_parallel", 42, "Megatron dynamic context parallelism", (False,)),
    Pending("*.megatron.max_seqlen_per_dp_cp_rank", 42, "Megatron context parallelism (sequence budget per rank)",
            (None,)),
)
"""Every pending key rule, by issue."""


def pending_rule(key: str) -> Pending | None:
    """The rule a dotted key falls under, or None."""
    return next((rule for rule in PENDING if fnmatchcase(key, rule.pattern)), None)


def _gate_off(rule: Pending, values: dict[str, Any]) -> bool:
    if rule.gate is None:
        return False
    gate_key, off = rule.gate
    return all(value in off for key, value in values.items() if fnmatchcase(key, gate_key))


def pending_refusal(key: str, value: Any, values: dict[str, Any]) -> str | None:
    """Why ``key=value`` cannot run yet (None: it asks for what rlvr does today). ``values`` holds
    every dotted leaf of the config being loaded (for the rule's gate)."""
    rule = pending_rule(key)
    if rule is None or ANY in rule.inert or value in rule.inert or _gate_off(rule, values):
        return None
    today = f" (rlvr runs {key.rpartition('.')[2]}={rule.inert[0]!r} today)" if rule.inert else ""
    return (f"{rule.feature} is not in rlvr yet: issue {rule.issue} builds it{today}; remove the key or set it "
            f"to {' / '.join(repr(v) for v in rule.inert) or 'its off value'}")
