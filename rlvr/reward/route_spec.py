"""The value of a reward route (``reward.routes.<domain>``): one reward source, or a weighted sum.

Grammar: terms joined by ``+``; a term is ``name`` (weight 1) or ``<weight>*name``. Examples:
``math_rule``, ``reward_model+0.5*math_rule``, ``reward_model+0*naive`` (a weight of 0 computes
and logs the rule's score and accuracy beside the reward model's, without rewarding it: the gap
between the two shows reward hacking). A name is a reward worker, a reward manager, an object path
``pkg.module:Name``, or ``reward_model`` (the discriminative reward model). Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RM_ROUTE", "RouteTerm", "parse_route"]

RM_ROUTE = "reward_model"
"""The discriminative reward model's name in ``reward.routes``."""


@dataclass(frozen=True)
class RouteTerm:
    """One term of a route: ``weight * name``."""

    weight: float
    name: str


def parse_route(target: str, key: str = "reward.routes") -> list[RouteTerm]:
    """The terms of a route value (see the module docstring).

    Raises:
        ValueError: an empty term, a weight that is not a number, or a name twice (the message
            names ``key``).
    """
    terms: list[RouteTerm] = []
    for raw in str(target).split("+"):
        text = raw.strip()
        weight_text, _, name = text.rpartition("*")
        name = name.strip()
        if not name:
            raise ValueError(f"{key}: {target!r} has an empty term; write terms like 'reward_model+0.5*math_rule'")
        try:
            weight = float(weight_text) if weight_text.strip() else 1.0
        except ValueError:
            raise ValueError(f"{key}: {weight_text.strip()!r} in {target!r} is not a number; a term is name or "
                             "<weight>*name, e.g. 0.5*math_rule") from None
        if any(term.name == name for term in terms):
            raise ValueError(f"{key}: {target!r} names {name!r} twice; give it one term with the summed weight")
        terms.append(RouteTerm(weight, name))
    return terms
