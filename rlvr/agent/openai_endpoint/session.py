"""One sample's conversation through the OpenAI-compatible endpoint, recorded as token ids.

A session is the trajectory of one sample whose agent talks to rlvr's ``/v1/chat/completions``. Its
first request's messages are rendered with the chat template (and the request's ``tools``) into the
prompt ids. Every later request must repeat the conversation so far exactly (the messages it sent
and the assistant messages it received) and add new messages at the end (tool results, user turns):
only those new messages are rendered, as the ids the chat template puts after an assistant turn
(:class:`~rlvr.agent.chat.ChatTurns`, mask 0), and the model continues from the recorded ids. The
model's own tokens are never decoded and encoded again, so the trajectory holds exactly the ids,
log-probs and weight versions the engine sampled, like a ``tool_agent`` trajectory.

A request that rewrites the conversation (drops or edits a message, adds an assistant message the
model did not write) is refused with a message saying which message differs.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any

from rlvr.agent.trajectory import Trajectory

__all__ = ["ChatSession", "RequestError", "normalise_messages"]

INSERTABLE_ROLES = ("tool", "user")


class RequestError(ValueError):
    """A request the endpoint refuses; ``status`` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def _text(content: Any, where: str) -> str:
    """A message's content as text (a string, null, or a list of ``{"type": "text"}`` parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    raise RequestError(f"{where}: content must be a string or a list of text parts")


def _calls(tool_calls: Any, where: str) -> list[tuple[str, Any]]:
    """``[(name, arguments)]`` of an assistant message's ``tool_calls`` (arguments decoded from JSON)."""
    calls = []
    for k, call in enumerate(tool_calls or []):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise RequestError(f"{where}: tool_calls[{k}] must have function.name and function.arguments")
        arguments = function.get("arguments", "{}")
        try:
            arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
        except json.JSONDecodeError:
            raise RequestError(f"{where}: tool_calls[{k}].function.arguments is not JSON") from None
        calls.append((function["name"], arguments))
    return calls


def normalise_messages(messages: Any) -> list[dict[str, Any]]:
    """Messages reduced to what the chat template renders and what the session compares:
    ``{"role", "content"}`` plus ``"tool_calls": [(name, arguments)]`` for assistant messages.

    Raises:
        RequestError: not a non-empty list of messages with a role and text content.
    """
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list of chat messages")
    normal = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or message.get("role") not in ("system", "user", "assistant", "tool"):
            raise RequestError(f"{where} must be an object whose role is system, user, assistant or tool")
        entry: dict[str, Any] = {"role": message["role"], "content": _text(message.get("content"), where)}
        if message["role"] == "assistant":
            entry["tool_calls"] = _calls(message.get("tool_calls"), where)
        normal.append(entry)
    return normal


@dataclass
class ChatSession:
    """The recorded conversation of one sample (see the module docstring).

    Attributes:
        session_id: the id in the endpoint's URL.
        row: the sample's data row (what the agent function receives).
        trajectory: prompt and response ids, mask, log-probs and weights versions so far (None before
            the first request).
        transcript: the normalised conversation so far (what the next request must start with).
        closed: no more requests are served (the agent returned, failed or ran out of time).
    """

    session_id: str
    row: dict[str, Any]
    trajectory: Trajectory | None = None
    transcript: list[dict[str, Any]] = field(default_factory=list)
    closed: bool = False
    requests: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def new_messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The messages of a later request after the recorded conversation (tool or user messages).

        Raises:
            RequestError: the request does not repeat the conversation so far, or adds nothing, or
                adds an assistant or system message.
        """
        known = len(self.transcript)
        for i, (sent, recorded) in enumerate(zip(messages, self.transcript)):
            if sent != recorded:
                raise RequestError(
                    f"messages[{i}] differs from the conversation this session recorded ({sent['role']} message "
                    f"expected {recorded['role']!r} with the same content): rlvr trains on the exact tokens of the "
                    "conversation, so send back every earlier message, and the assistant messages as you received "
                    "them, unchanged, and only add new messages at the end")
        if len(messages) <= known:
            raise RequestError(f"the request repeats the conversation ({known} messages) but adds no new message "
                               "after the last assistant message")
        added = messages[known:]
        for offset, message in enumerate(added):
            if message["role"] not in INSERTABLE_ROLES:
                raise RequestError(f"messages[{known + offset}] is a new {message['role']} message; after the model's "
                                   f"turn only {' or '.join(INSERTABLE_ROLES)} messages may be added")
        return added

    def add_sampled(self, ids: list[int], log_probs: list[float], versions: list[int]) -> None:
        assert self.trajectory is not None
        self.trajectory.add_sampled(ids, log_probs, versions)

    def add_inserted(self, ids: list[int]) -> None:
        assert self.trajectory is not None
        self.trajectory.add_inserted(ids)
