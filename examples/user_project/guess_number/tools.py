"""The ``compare`` tool of the ``tool_agent`` loop (listed in ``tools.yaml``)."""

from __future__ import annotations

from typing import Any

from rlvr.agent.tools import BaseTool, ToolArgumentError, ToolResponse, function_schema


class CompareTool(BaseTool):
    """``compare(guess)`` answers "too small", "too big" or "right" for the trajectory's secret
    number, which the row gives as ``extra_info.tools_kwargs.compare.create_kwargs.secret``."""

    def __init__(self, config: dict[str, Any] | None = None, tool_schema: dict[str, Any] | None = None) -> None:
        super().__init__(config, tool_schema)
        self.secrets: dict[str, int] = {}

    @classmethod
    def default_schema(cls) -> dict[str, Any]:
        return function_schema("compare", "Compare a guess with the secret number.",
                               {"guess": {"type": "integer", "description": "the number to compare"}}, ["guess"])

    def create(self, instance_id: str | None = None, secret: int | None = None, **kwargs: Any) -> str:
        instance_id = super().create(instance_id)
        if secret is None:
            raise ValueError("the compare tool needs the row's secret: extra_info.tools_kwargs.compare.create_kwargs")
        self.secrets[instance_id] = int(secret)
        return instance_id

    def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
                ) -> tuple[ToolResponse, float, dict[str, Any]]:
        guess = self.check_arguments(parameters)["guess"]
        if not isinstance(guess, int):
            raise ToolArgumentError(f"guess must be an integer, got {guess!r}")
        secret = self.secrets[instance_id]
        verdict = "right" if guess == secret else "too small" if guess < secret else "too big"
        return ToolResponse(verdict), 0.0, {"distance": float(abs(guess - secret))}

    def release(self, instance_id: str, **kwargs: Any) -> None:
        self.secrets.pop(instance_id, None)
