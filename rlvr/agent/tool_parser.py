"""Tool-call parsers: find the tool calls in the text of a model turn (registry: ``multi_turn.format``).

A parser reads the decoded text of the tokens the model sampled in one turn (decoding is only for
reading the calls; the training sequence keeps the sampled ids). A call that cannot be read (broken
JSON, no name, arguments that are not an object, a tag left open) is returned as an error string:
the agent loop shows it to the model as the tool's output and counts it, it never raises.

``hermes`` (Hermes / Qwen style, what Qwen2.5 and many open models are trained on)::

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "123 * 456"}}
    </tool_call>

One tag may also hold a JSON list of calls, the format SmolLM2-Instruct was trained on
(``<tool_call>[{"name": ..., "arguments": {...}}, ...]</tool_call>``, run in order; ``[]`` is no
call). A list with one malformed entry is one error and none of its calls run.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from rlvr.utils.registry import Registry

__all__ = ["ToolCall", "ParsedTurn", "ToolParser", "TOOL_PARSERS", "register_tool_parser", "get_tool_parser",
           "HermesToolParser"]


@dataclass(frozen=True)
class ToolCall:
    """One call the model asked for: a tool name and its arguments (a JSON object)."""

    name: str
    arguments: dict[str, Any]


@dataclass
class ParsedTurn:
    """What a parser found in one turn.

    Attributes:
        content: the turn's text with the calls removed.
        calls: well-formed calls, in order.
        errors: one message per malformed call (shown to the model, counted in the metrics).
    """

    content: str
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def wants_tools(self) -> bool:
        """The turn asked for at least one tool (well-formed or not)."""
        return bool(self.calls or self.errors)


class ToolParser(Protocol):
    """Reads tool calls from a turn's text."""

    stop: list[str]
    """Stop strings that end a turn right after a call (``multi_turn.stop_after_tool_call``)."""

    def parse(self, text: str) -> ParsedTurn:
        """The calls (and malformed calls) in ``text``."""
        ...


ToolParserFactory = Callable[[], ToolParser]
TOOL_PARSERS: Registry[ToolParserFactory] = Registry("tool-call parser")


def register_tool_parser(name: str) -> Callable[[ToolParserFactory], ToolParserFactory]:
    """Decorator registering a parser class (built without arguments) under ``name``."""
    return TOOL_PARSERS.register(name)


def get_tool_parser(name: str) -> ToolParser:
    """A new parser of the registered ``name``; an unknown name raises ``KeyError`` listing the valid ones."""
    return TOOL_PARSERS.get(name)()


def _calls_from_json(body: str) -> list[ToolCall]:
    """The calls in the JSON between the tags: one call object, or a list of them (SmolLM2's
    function-calling format; ``[]`` is no call); ``ValueError`` says what is wrong with it."""
    try:
        payload = json.loads(body)
    except json.JSONDecodeError as err:
        raise ValueError(f"the tool call is not valid JSON ({err.msg} at character {err.pos})") from None
    return [_call_from_object(item) for item in payload] if isinstance(payload, list) else [_call_from_object(payload)]


def _call_from_object(payload: Any) -> ToolCall:
    """One call from a decoded JSON value; ``ValueError`` says what is wrong with it."""
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str) or not payload["name"]:
        raise ValueError('the tool call must be a JSON object with a "name" and "arguments"')
    arguments = payload.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            raise ValueError('"arguments" must be a JSON object') from None
    if not isinstance(arguments, dict):
        raise ValueError('"arguments" must be a JSON object')
    return ToolCall(name=payload["name"], arguments=arguments)


@register_tool_parser("hermes")
class HermesToolParser:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (see the module docstring)."""

    START, END = "<tool_call>", "</tool_call>"
    _CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

    def __init__(self) -> None:
        self.stop = [self.END]

    def parse(self, text: str) -> ParsedTurn:
        calls, errors = [], []
        for match in self._CALL.finditer(text):
            try:
                calls += _calls_from_json(match.group(1).strip())
            except ValueError as err:
                errors.append(f"{err}. Write {self.START}{{\"name\": ..., \"arguments\": {{...}}}}{self.END}")
        content = self._CALL.sub("", text)
        if self.START in content:
            errors.append(f"the tool call was not closed with {self.END}")
            content = content[: content.index(self.START)]
        return ParsedTurn(content=content, calls=calls, errors=errors)
