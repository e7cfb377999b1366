"""The tool interface: an OpenAI function schema and a create / execute / calc_reward / release life cycle.

Modelled on verl's ``BaseTool`` (same method names, arguments and return values), but synchronous:
the agent loop runs the calls of all samples at once in threads, each bounded by a timeout (see
:mod:`rlvr.agent.tools.executor`). One tool object serves every sample; ``create`` opens a
per-trajectory instance (its id keys any state the tool keeps) and ``release`` closes it.

A tool's answer is a :class:`ToolResponse`; ``execute`` also returns a step reward (added to the
trajectory's reward at the turn that made the call) and metrics. ``calc_reward`` is asked once per
trajectory before ``release`` (added at the trajectory's last sampled token). A tool that raises
does not end the rollout: the model sees an error message as the tool's output.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

__all__ = ["BaseTool", "ToolResponse", "ToolArgumentError", "function_schema"]


class ToolArgumentError(ValueError):
    """The model called a tool with arguments that do not fit its schema; the message is shown to it."""


@dataclass(frozen=True)
class ToolResponse:
    """What a tool returns to the model (text only)."""

    text: str


def function_schema(name: str, description: str, properties: dict[str, dict], required: list[str]) -> dict:
    """An OpenAI function-tool schema ``{"type": "function", "function": {...}}``."""
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": list(required)}}}


class BaseTool(ABC):
    """Base class of tools.

    Args:
        config: the tool's ``config`` mapping from the tools YAML file (tool-specific settings).
        tool_schema: an OpenAI function schema (``{"type": "function", "function": {"name",
            "description", "parameters"}}``); None uses :meth:`default_schema`.

    Subclasses override :meth:`execute` (and :meth:`default_schema`, and the life-cycle methods when
    they keep per-trajectory state).
    """

    def __init__(self, config: dict[str, Any] | None = None, tool_schema: dict[str, Any] | None = None) -> None:
        self.config = dict(config or {})
        self.tool_schema = tool_schema if tool_schema is not None else self.default_schema()
        if self.tool_schema is None:
            raise ValueError(f"{type(self).__name__} has no tool_schema; give one in the tools YAML file or "
                             "override default_schema()")
        function = self.tool_schema.get("function")
        if self.tool_schema.get("type") != "function" or not isinstance(function, dict) or not function.get("name"):
            raise ValueError(f"{type(self).__name__}: tool_schema must look like {{'type': 'function', 'function': "
                             f"{{'name': ..., 'description': ..., 'parameters': {{...}}}}}}, got {self.tool_schema!r}")
        self.name: str = str(function["name"])

    @classmethod
    def default_schema(cls) -> dict[str, Any] | None:
        """The schema used when the YAML file gives none (None: a schema must be given)."""
        return None

    def get_openai_tool_schema(self) -> dict[str, Any]:
        """The tool's OpenAI function schema (what a chat template's ``tools=`` takes)."""
        return self.tool_schema

    def check_arguments(self, parameters: Any) -> dict[str, Any]:
        """``parameters`` as a dict with every required property present.

        Raises:
            ToolArgumentError: not a JSON object, or a required property is missing.
        """
        if not isinstance(parameters, dict):
            raise ToolArgumentError(f"the arguments of {self.name} must be a JSON object, got {parameters!r}")
        required = self.tool_schema["function"].get("parameters", {}).get("required", [])
        missing = [key for key in required if key not in parameters]
        if missing:
            raise ToolArgumentError(f"{self.name} needs the argument(s) {', '.join(missing)}")
        return parameters

    def create(self, instance_id: str | None = None, **kwargs: Any) -> str:
        """Open an instance for one trajectory; returns its id (``kwargs``: the row's ``create_kwargs``)."""
        return instance_id if instance_id is not None else uuid.uuid4().hex

    @abstractmethod
    def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
                ) -> tuple[ToolResponse, float, dict[str, Any]]:
        """Run one call; returns ``(response, step reward, metrics)``. Raise
        :class:`ToolArgumentError` for arguments the model got wrong (the message is shown to it)."""

    def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        """The trajectory's reward from this tool's state (0 unless a tool keeps score)."""
        return 0.0

    def release(self, instance_id: str, **kwargs: Any) -> None:
        """Close the instance (free what :meth:`create` opened)."""
        return None
