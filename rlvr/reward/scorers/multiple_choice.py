"""Multiple-choice answers (letters ``A``-``J``, as in MMLU / MMLU-Pro / GPQA).

The chosen letter is taken from, in this order: the last ``\\boxed{}``, the last
``<answer>...</answer>``, the last "answer is (X)" / "Answer: X" phrase, or a final line that
is just a letter (``B``, ``(B)``, ``B.``). ``<think>`` sections are removed first. A response
with no letter scores 0. The ground truth is a letter, optionally decorated (``"(b)"``,
``"B) Paris"``).
"""

from __future__ import annotations

import re
from typing import Any

from rlvr.reward.scorers.registry import register_scorer
from rlvr.reward.scorers.text import answer_tag, last_boxed, last_nonempty_line, strip_think

_LETTER = re.compile(r"^\s*(?:\\text\{)?\(?([A-Ja-j])\)?\}?(?:[.):]|\s|$)")
_PHRASE = re.compile(r"answer\s*(?:is|:)\s*:?\s*\(?\**([A-J])\b", flags=re.IGNORECASE)


def _letter(candidate: str | None) -> str | None:
    """The option letter that ``candidate`` starts with (``"(B) Paris"`` -> ``"B"``), if any."""
    if candidate is None:
        return None
    match = _LETTER.match(candidate)
    return match.group(1).upper() if match else None


def extract_choice(solution_str: str) -> str | None:
    """The letter the response chose, or None (see the module docstring for the order)."""
    text = strip_think(solution_str)
    for candidate in (last_boxed(text), answer_tag(text)):
        if candidate is not None:
            return _letter(candidate)
    phrases = _PHRASE.findall(text)
    if phrases:
        return phrases[-1].upper()
    line = last_nonempty_line(text)
    return _letter(line) if line is not None and len(line) <= 4 else None


def compute_score(solution_str: str, ground_truth: Any) -> dict:
    """1.0 when the chosen letter equals the ground-truth letter, else 0.0.

    Returns:
        ``{"score": float, "acc": float}``.
    """
    expected = _letter(str(ground_truth))
    if expected is None:
        raise ValueError(f"multiple-choice ground truth {ground_truth!r} does not start with an option letter A-J")
    correct = extract_choice(solution_str) == expected
    return {"score": float(correct), "acc": float(correct)}


@register_scorer(["multiple_choice", "mmlu", "gpqa"])
def compute_score_registered(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> dict:
    """Registry entry for multiple-choice data sources."""
    return compute_score(solution_str, ground_truth)
