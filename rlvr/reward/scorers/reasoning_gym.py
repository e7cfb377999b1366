"""Every reasoning-gym task, scored by the task's own answer checker (``score_answer``).

Data source: ``reasoning_gym/<task>`` (e.g. ``reasoning_gym/chain_sum``). The checker needs
the generated entry (``{"question", "answer", "metadata"}``); it is taken from
``extra_info["entry"]`` when present, else rebuilt from the ground truth (the entry's
``answer``) and ``extra_info["metadata"]``. Tasks whose checker reads only the answer work
with the ground truth alone.

The answer is the content of the last ``<answer>...</answer>``; without tags, the last
non-empty line of the response (after removing ``<think>`` sections). The score is the
checker's value in [0, 1] (some tasks give partial credit); ``acc`` is 1.0 only for a full score.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from rlvr.reward.scorers.registry import UnknownDataSourceError, register_scorer
from rlvr.reward.scorers.text import answer_tag, last_nonempty_line, strip_think

PREFIX = "reasoning_gym/"


@functools.lru_cache(maxsize=None)
def _checker(task: str) -> Callable[[str | None, dict], float]:
    """The task's ``score_answer`` (cached: building a dataset object is not free)."""
    import reasoning_gym
    from reasoning_gym.factory import DATASETS

    if task not in DATASETS:
        raise UnknownDataSourceError(PREFIX + task, [PREFIX + name for name in sorted(DATASETS)])
    return reasoning_gym.get_score_answer_fn(task)


def extract_answer(solution_str: str) -> str | None:
    """The ``<answer>`` content, else the last non-empty line, else None."""
    text = strip_think(solution_str)
    tagged = answer_tag(text)
    return tagged if tagged is not None else last_nonempty_line(text)


def build_entry(ground_truth: Any, extra_info: dict | None) -> dict:
    """The reasoning-gym entry the checker expects (see the module docstring)."""
    info = extra_info or {}
    if "entry" in info:
        return dict(info["entry"])
    return {"question": info.get("question", ""), "answer": ground_truth, "metadata": info.get("metadata", {})}


def compute_score(task: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> dict:
    """Score one response with reasoning-gym task ``task``'s checker.

    Returns:
        ``{"score": float in [0, 1], "acc": 1.0 | 0.0}``.
    """
    score = float(_checker(task)(extract_answer(solution_str), build_entry(ground_truth, extra_info)))
    return {"score": score, "acc": float(score >= 1.0)}


@register_scorer(PREFIX + "*")
def compute_score_registered(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> dict:
    """Registry entry for the ``reasoning_gym/<task>`` family."""
    return compute_score(data_source[len(PREFIX) :], solution_str, ground_truth, extra_info)
