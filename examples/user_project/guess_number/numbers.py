"""Reading a guess out of the model's text."""

from __future__ import annotations

import re

_INTEGER = re.compile(r"-?\d+")


def last_number(text: str) -> int | None:
    """The last integer written in ``text`` (the model's final guess), or None."""
    found = _INTEGER.findall(text)
    return int(found[-1]) if found else None
