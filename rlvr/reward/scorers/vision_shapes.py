"""One-word answers about drawn shapes (the vision job's data source ``vision_shapes``).

The questions ask for the colour or the shape of the one shape in a picture and say "Answer with
one word." A response is right (``acc`` 1) when, lower-cased and stripped of spaces and a final full
stop or exclamation mark, it is the word. ``mentions`` is the looser reading: the response names the
right word and no other word of the same kind ("The shape is red." counts, "red or blue" does not),
which separates seeing the answer from giving it in the asked form. The reward (``score``) is 1 for a
right answer; for a response that only mentions it, the share of its words the answer is, at most
0.5 ("A red": 0.5, "A red circle.": 1/3, "The shape is red.": 1/4); 0 otherwise. A sentence naming
the right colour is better than a wrong one, a shorter one better than a longer one, and the word
alone best. The graded part matters after a caption warm start ("A red circle."): with a flat 0.5
for any mention, GRPO saw no difference between "A red circle." and "A red" and, when no sampled
answer happened to be the bare word, never found it (seed 2 of the vision job stayed at 0%).
"""

from __future__ import annotations

import re
from typing import Any

from rlvr.reward.scorers.registry import register_scorer

__all__ = ["COLOUR_WORDS", "SHAPE_WORDS", "compute_score"]

COLOUR_WORDS = ("red", "green", "blue", "yellow", "purple", "orange")
SHAPE_WORDS = ("circle", "square", "triangle")


def _named(text: str, words: tuple[str, ...]) -> set[str]:
    found = set(re.findall(r"[a-z]+", text.lower()))
    return {word for word in words if word in found or f"{word}s" in found}


@register_scorer("vision_shapes")
def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> dict:
    """``{"score", "acc", "mentions"}`` of one response (see the module docstring)."""
    truth = str(ground_truth).strip().lower()
    answer = solution_str.strip().lower().rstrip(".!").strip()
    right = float(answer == truth)
    words = COLOUR_WORDS if truth in COLOUR_WORDS else SHAPE_WORDS
    mentions = float(_named(solution_str, words) == {truth})
    share = mentions * min(0.5, 1.0 / max(len(solution_str.split()), 1))
    return {"score": max(right, share), "acc": right, "mentions": mentions}
