"""Countdown (TinyZero-style): combine the given numbers with ``+ - * /`` and parentheses to reach
the target, each number used exactly once.

The equation is read from the last ``<answer>...</answer>`` (after removing ``<think>``
sections). The ground truth is ``{"target": int, "numbers": [int, ...]}``. The expression is
evaluated with a small arithmetic parser (Python's ``ast``; no ``eval``), exact fractions,
and at most 64 numeric literals. Score 1.0 for a correct equation, else 0.0.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from fractions import Fraction
from typing import Any

from rlvr.reward.scorers.registry import register_scorer
from rlvr.reward.scorers.text import answer_tag, strip_think

_ALLOWED = re.compile(r"^[0-9+\-*/().\s]+$")
_MAX_LITERALS = 64
_OPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
}


def _evaluate(node: ast.AST) -> Fraction:
    """Exact value of an arithmetic AST made only of integers, ``+ - * /`` and unary minus."""
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_evaluate(node.operand)
    raise ValueError(f"unsupported element {ast.dump(node)[:60]}")


def _literals(tree: ast.AST) -> list[int]:
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)]


def check_equation(equation: str, target: int, numbers: list[int]) -> bool:
    """True when ``equation`` uses exactly ``numbers`` (as a multiset) and evaluates to ``target``."""
    equation = equation.split("=", 1)[0]
    if len(equation) > 1000 or not _ALLOWED.match(equation) or equation.count("(") > _MAX_LITERALS:
        return False
    try:
        tree = ast.parse(equation.strip(), mode="eval")
    except SyntaxError:
        return False
    literals = _literals(tree)
    if len(literals) > _MAX_LITERALS or Counter(literals) != Counter(int(n) for n in numbers):
        return False
    try:
        return _evaluate(tree) == Fraction(int(target))
    except (ValueError, ZeroDivisionError):
        return False


def compute_score(solution_str: str, ground_truth: dict) -> dict:
    """Score one response against ``{"target": int, "numbers": [int, ...]}``.

    Returns:
        ``{"score": float, "acc": float}``.
    """
    equation = answer_tag(strip_think(solution_str))
    correct = equation is not None and check_equation(equation, ground_truth["target"], list(ground_truth["numbers"]))
    return {"score": float(correct), "acc": float(correct)}


@register_scorer("countdown")
def compute_score_registered(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> dict:
    """Registry entry for the countdown data source."""
    return compute_score(solution_str, ground_truth)
