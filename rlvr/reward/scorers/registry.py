"""The scorer registry: data source name -> ``compute_score`` function.

Every scorer has one signature::

    compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict | None

A dict must contain ``"score"`` and may carry ``"acc"`` and other per-sample values; ``None``
means "this scorer does not apply to the sample" (it gets reward 0 and is left out of the
source's metrics). A name ending in ``/*`` registers a family: ``"reasoning_gym/*"`` serves
``reasoning_gym/chain_sum``, ``reasoning_gym/leg_counting``, ...
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Sequence
from typing import Any, Union

from rlvr.utils.errors import RewardError
from rlvr.utils.registry import Registry

ScoreValue = Union[float, dict, None]
Scorer = Callable[..., ScoreValue]

SCORER_REGISTRY: Registry[Scorer] = Registry("reward scorer")


class UnknownDataSourceError(RewardError, NotImplementedError):
    """No scorer is registered for a sample's data source (never silently defaulted; a
    ``NotImplementedError`` too, as verl's ``default_compute_score`` raises)."""

    def __init__(self, data_source: str, known: Sequence[str]) -> None:
        self.data_source = data_source
        super().__init__(
            f"no reward scorer is registered for data_source {data_source!r}; known data sources: "
            f"{', '.join(known)}. Register one with @rlvr.reward.scorers.register_scorer({data_source!r}) "
            "or set custom_reward_function.path/name in the config"
        )


def register_scorer(name_or_names: str | Sequence[str]) -> Callable[[Scorer], Scorer]:
    """Decorator registering a scorer under one data source name or several (duplicates raise)."""
    names = [name_or_names] if isinstance(name_or_names, str) else list(name_or_names)

    def add(fn: Scorer) -> Scorer:
        for name in names:
            SCORER_REGISTRY.add(name, fn)
        return fn

    return add


def get_scorer(data_source: str) -> Scorer:
    """The scorer for ``data_source``: an exact name, else the ``<prefix>/*`` family it belongs to.

    Raises:
        UnknownDataSourceError: naming the data source and listing the known ones.
    """
    name = str(data_source)
    if SCORER_REGISTRY.has(name):
        return SCORER_REGISTRY.get(name)
    family = name.split("/", 1)[0] + "/*"
    if "/" in name and family in SCORER_REGISTRY:
        return SCORER_REGISTRY.get(family)
    raise UnknownDataSourceError(name, SCORER_REGISTRY.names())


def default_compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None
) -> ScoreValue:
    """Score one response with the scorer registered for its ``data_source``.

    Raises:
        UnknownDataSourceError: the data source has no scorer (the message lists the known ones).
    """
    return get_scorer(data_source)(data_source, solution_str, ground_truth, extra_info)


class ScorerTimeoutError(RewardError, TimeoutError):
    """A scorer gave up on a sample after its own time limit (counted as a timeout by managers; a
    ``TimeoutError`` too, which is what verl's managers catch)."""


class ScorerArgumentError(ValueError, AssertionError):
    """A scorer was called with an invalid argument (an ``AssertionError`` too, as verl asserts these)."""


def call_scorer(compute_score: Scorer, kwargs: dict) -> ScoreValue:
    """``compute_score(**kwargs)``; an ``async`` scorer's coroutine is run to completion."""
    value = compute_score(**kwargs)
    return asyncio.run(value) if inspect.isawaitable(value) else value


def call_scorer_tagged(compute_score: Scorer, kwargs: dict) -> tuple[str, Any]:
    """Call the scorer (:func:`call_scorer`) and tag the outcome for a parent process:
    ``("ok", value)``, ``("timeout", message)`` (a ``TimeoutError``, the scorer's own included, as
    verl counts it) or ``("unknown", message)`` (unknown data source, never turned into a fallback
    score); any other exception propagates."""
    try:
        return "ok", call_scorer(compute_score, kwargs)
    except TimeoutError as exc:
        return "timeout", str(exc)
    except UnknownDataSourceError as exc:
        return "unknown", str(exc)
