"""Text helpers shared by the rule scorers: thinking removal and answer extraction."""

from __future__ import annotations

import re

_THINK_BLOCK = re.compile(r"<think>.*?</think>", flags=re.DOTALL)
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", flags=re.DOTALL)


def strip_think(text: str) -> str:
    """Remove ``<think>...</think>`` sections; an unclosed ``<think>`` swallows the rest.

    A response that never closes its thinking has not given an answer yet, so everything after
    the opening tag is dropped. A stray ``</think>`` without an opening tag (chat templates that
    put ``<think>`` in the prompt) drops everything before it.
    """
    text = _THINK_BLOCK.sub("", text)
    if "<think>" in text:
        text = text.split("<think>", 1)[0]
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    return text


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) with balanced braces; None if absent
    or unbalanced."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    brace = text.find("{", start)
    if brace < 0:
        return None
    depth = 0
    for pos in range(brace, len(text)):
        if text[pos] == "{":
            depth += 1
        elif text[pos] == "}":
            depth -= 1
            if depth == 0:
                return text[brace + 1 : pos]
    return None


def answer_tag(text: str) -> str | None:
    """Content of the last ``<answer>...</answer>`` pair, stripped; None if there is none."""
    matches = _ANSWER_TAG.findall(text)
    return matches[-1].strip() if matches else None


def last_nonempty_line(text: str) -> str | None:
    """The last line that is not blank, stripped; None for an empty text."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else None
