"""GSM8K answer checking (Cobbe et al., 2021, "Training Verifiers to Solve Math Word Problems").

Extraction methods:

- ``strict`` (verl's): the number right after ``#### `` (the marker, one space, then digits, ``.``,
  ``,`` and a leading ``-``) within the last 300 characters of the response; when there are several
  markers the last one counts; thousands separators are removed. ``####10`` and ``####\\n10`` hold
  no answer.
- ``flexible`` (verl's): the last number in the last 300 characters of the response.
- ``lenient``: ``<think>`` sections removed first, then the number after the last ``####``
  anywhere in the response, with any white space after the marker, a currency sign (``$18``) or
  thousands separators; a trailing period is ignored.

``strict`` and ``flexible`` compare the answer with ``str(ground_truth)`` as strings, as verl does
(``18.00`` is not ``18``). ``lenient`` compares numbers (``18.00`` equals ``18``) and also takes a
full GSM8K solution ending in ``#### 72`` as the ground truth.

Registered data sources: ``openai/gsm8k`` and ``gsm8k`` (strict), ``gsm8k_flexible`` and
``gsm8k_lenient``; each returns the float score, as verl's ``default_compute_score`` does.
"""

from __future__ import annotations

import re
from typing import Any

from rlvr.reward.scorers.registry import ScorerArgumentError, register_scorer
from rlvr.reward.scorers.text import strip_think

METHODS = ("strict", "flexible", "lenient")
SOLUTION_CLIP_CHARS = 300
"""``strict`` and ``flexible`` look at the end of the response only (the final answer is there)."""

_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_FLEXIBLE = re.compile(r"(\-?[0-9\.\,]+)")
_NUMBER = r"-?(?:\$\s?)?-?(?:[0-9][0-9,]*(?:\.[0-9]+)?|\.[0-9]+)"
_LENIENT = re.compile(r"####\s*(" + _NUMBER + ")")


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
    """The answer string of a response (see the module docstring), or None when there is none.

    Raises:
        ScorerArgumentError: an unknown ``method`` (an ``AssertionError`` too, as in verl).
    """
    if method not in METHODS:
        raise ScorerArgumentError(f"gsm8k extraction method must be one of {METHODS}, got {method!r}")
    if method == "lenient":
        matches = _LENIENT.findall(strip_think(solution_str))
        return matches[-1] if matches else None
    tail = solution_str[-SOLUTION_CLIP_CHARS:]
    if method == "strict":
        matches = _STRICT.findall(tail)
        return matches[-1].replace(",", "").replace("$", "") if matches else None
    numbers = [token for token in _FLEXIBLE.findall(tail) if token not in ("", ".")]
    return numbers[-1] if numbers else None


def ground_truth_answer(ground_truth: Any) -> float:
    """The numeric ground truth of the ``lenient`` method: a number, ``"72"``, ``"1,000"`` or a full
    GSM8K solution ending in ``#### 72``."""
    text = str(ground_truth)
    if "####" in text:
        text = text.rsplit("####", 1)[1].strip()
    value = normalize_number(text)
    if value is None:
        raise ValueError(f"GSM8K ground truth {ground_truth!r} is not a number")
    return value


def compute_score(
    solution_str: str, ground_truth: Any, method: str = "strict", format_score: float = 0.0, score: float = 1.0
) -> float:
    """Score one response: ``score`` when the extracted answer equals the ground truth,
    ``format_score`` when an answer was extracted but is wrong, 0.0 when none was found."""
    answer = extract_solution(solution_str, method)
    if answer is None:
        return 0.0
    if method == "lenient":
        predicted = normalize_number(answer)
        correct = predicted is not None and abs(predicted - ground_truth_answer(ground_truth)) < 1e-9
    else:
        correct = answer == str(ground_truth)
    return float(score if correct else format_score)


@register_scorer(["openai/gsm8k", "gsm8k"])
def compute_score_strict(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> float:
    """Registry entry: verl's strict ``#### `` extraction."""
    return compute_score(solution_str, ground_truth, method="strict")


@register_scorer("gsm8k_flexible")
def compute_score_flexible(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None
) -> float:
    """Registry entry: the last number of the response."""
    return compute_score(solution_str, ground_truth, method="flexible")


@register_scorer("gsm8k_lenient")
def compute_score_lenient(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> float:
    """Registry entry: the lenient ``####`` extraction with numeric comparison."""
    return compute_score(solution_str, ground_truth, method="lenient")
