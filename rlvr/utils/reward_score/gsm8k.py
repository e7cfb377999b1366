"""GSM8K answer checking (Cobbe et al., 2021, "Training Verifiers to Solve Math Word Problems").

Two extraction modes:

- ``strict``: the answer is the number after ``####`` (the dataset's own format). When a
  response contains several ``####`` markers the LAST one counts: the model's final statement
  wins, and spraying several guesses earns nothing unless the last one is right.
- ``flexible``: the last number anywhere in the response.

Numbers are normalised before comparison: thousands separators (``1,000``), a currency sign
(``$18``) and a trailing period (``72.``) are removed, and values compare numerically, so
``18.00`` equals ``18``. Text after the number (``#### 72 apples``) is ignored. ``<think>``
sections are removed first.
"""

from __future__ import annotations

import re
from typing import Any

from rlvr.utils.reward_score.registry import register_scorer
from rlvr.utils.reward_score.text import strip_think

_NUMBER = r"-?(?:\$\s?)?-?(?:[0-9][0-9,]*(?:\.[0-9]+)?|\.[0-9]+)"
_STRICT = re.compile(r"####\s*(" + _NUMBER + ")")
_FLEXIBLE = re.compile(_NUMBER)
_METHODS = ("strict", "flexible")


def normalize_number(text: str) -> float | None:
    """``"$1,234.50"`` -> ``1234.5``; None when the text is not a number."""
    cleaned = text.replace(",", "").replace("$", "").replace(" ", "").rstrip(".")
    if cleaned.startswith("--"):
        return None
    try:
        return float(cleaned)
    except ValueError:
        return None


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """The answer string of a response (``strict``: after the last ``####``; ``flexible``: the
    last number), or None when there is none."""
    if method not in _METHODS:
        raise ValueError(f"gsm8k extraction method must be one of {_METHODS}, got {method!r}")
    text = strip_think(solution_str)
    pattern = _STRICT if method == "strict" else _FLEXIBLE
    matches = pattern.findall(text)
    return matches[-1] if matches else None


def ground_truth_answer(ground_truth: Any) -> float:
    """The numeric ground truth: a number, ``"72"``, ``"1,000"`` or a full GSM8K solution
    ending in ``#### 72``."""
    text = str(ground_truth)
    if "####" in text:
        text = text.rsplit("####", 1)[1].strip()
    value = normalize_number(text)
    if value is None:
        raise ValueError(f"GSM8K ground truth {ground_truth!r} is not a number")
    return value


def compute_score(
    solution_str: str, ground_truth: Any, method: str = "strict", format_score: float = 0.0, score: float = 1.0
) -> dict:
    """Score one response: ``score`` when the extracted number equals the ground truth,
    ``format_score`` when a number was extracted but is wrong, 0 when none was found.

    Returns:
        ``{"score": float, "acc": 1.0 | 0.0}``.
    """
    answer = extract_solution(solution_str, method)
    if answer is None:
        return {"score": 0.0, "acc": 0.0}
    predicted = normalize_number(answer)
    correct = predicted is not None and abs(predicted - ground_truth_answer(ground_truth)) < 1e-9
    return {"score": score if correct else format_score, "acc": float(correct)}


@register_scorer(["openai/gsm8k", "gsm8k"])
def compute_score_strict(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> dict:
    """Registry entry: strict ``####`` extraction."""
    return compute_score(solution_str, ground_truth, method="strict")


@register_scorer("gsm8k_flexible")
def compute_score_flexible(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None
) -> dict:
    """Registry entry: last-number extraction."""
    return compute_score(solution_str, ground_truth, method="flexible")
