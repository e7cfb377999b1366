"""A calculator tool: evaluates an arithmetic expression by walking its syntax tree (no ``eval``).

Accepted: integer and decimal numbers, ``+ - * / // % **``, unary ``+``/``-`` and parentheses
(``×``, ``÷`` and ``^`` are read as ``*``, ``/`` and ``**``). Names, calls, attributes, strings and
every other construct are rejected with a message for the model. Sizes are bounded so that no
expression can take long: the text length, the exponent of ``**`` and the size of every
intermediate result.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

from rlvr.agent.tools.base import BaseTool, ToolArgumentError, ToolResponse, function_schema

__all__ = ["CalculatorTool", "evaluate_expression"]

MAX_EXPRESSION_CHARS = 200
MAX_RESULT_DIGITS = 100
"""An intermediate result may have at most this many digits (integers) or this magnitude (10**N)."""
MAX_EXPONENT = 100

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_SYMBOLS = {"×": "*", "÷": "/", "^": "**"}


def _checked(value: int | float) -> int | float:
    """``value`` if it is finite and within :data:`MAX_RESULT_DIGITS`; else an error for the model."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ToolArgumentError("the result is not a finite number")
    too_big = (abs(value) >= 10 ** MAX_RESULT_DIGITS) if isinstance(value, float) else \
        (value.bit_length() > MAX_RESULT_DIGITS * 3.33)
    if too_big:
        raise ToolArgumentError(f"a number in the calculation has more than {MAX_RESULT_DIGITS} digits")
    return value


def _power(base: int | float, exponent: int | float) -> int | float:
    if abs(exponent) > MAX_EXPONENT:
        raise ToolArgumentError(f"exponents larger than {MAX_EXPONENT} are not supported")
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0 \
            and base.bit_length() * exponent > MAX_RESULT_DIGITS * 3.33 + 64:
        raise ToolArgumentError(f"the result would have more than {MAX_RESULT_DIGITS} digits")
    result = operator.pow(base, exponent)
    if isinstance(result, complex):
        raise ToolArgumentError("the result is not a real number")
    return result


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _checked(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        apply = _power if isinstance(node.op, ast.Pow) else _BINARY[type(node.op)]
        try:
            return _checked(apply(left, right))
        except ZeroDivisionError:
            raise ToolArgumentError("division by zero") from None
        except OverflowError:
            raise ToolArgumentError(f"a number in the calculation has more than {MAX_RESULT_DIGITS} digits") from None
    raise ToolArgumentError(f"unsupported element {ast.dump(node)[:60]!r}: use numbers, + - * / // % ** "
                            "and parentheses only")


def format_number(value: int | float) -> str:
    """Integers as digits; floats with up to 12 significant digits (an integral float as an integer)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value) if isinstance(value, int) else f"{value:.12g}"


def evaluate_expression(expression: str) -> str:
    """The value of an arithmetic ``expression`` as text.

    Raises:
        ToolArgumentError: too long, not arithmetic, division by zero, or a result too large.
    """
    text = str(expression).strip().rstrip("=").strip()
    for symbol, replacement in _SYMBOLS.items():
        text = text.replace(symbol, replacement)
    if not text:
        raise ToolArgumentError("the expression is empty")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ToolArgumentError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise ToolArgumentError(f"cannot parse {text!r} as an arithmetic expression") from None
    return format_number(_eval(tree))


class CalculatorTool(BaseTool):
    """``calculator(expression)``: the value of an arithmetic expression (see the module docstring)."""

    @classmethod
    def default_schema(cls) -> dict[str, Any]:
        return function_schema(
            "calculator", "Evaluate an arithmetic expression and return its value.",
            {"expression": {"type": "string", "description": "the expression, e.g. '123 * 456'"}}, ["expression"])

    def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
                ) -> tuple[ToolResponse, float, dict[str, Any]]:
        arguments = self.check_arguments(parameters)
        return ToolResponse(evaluate_expression(arguments["expression"])), 0.0, {}
