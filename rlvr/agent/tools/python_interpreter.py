"""A Python interpreter tool: runs the model's code in the code sandbox and returns what it printed.

Every call is a fresh program in :class:`rlvr.sandbox.LocalSandbox` (own process, no network, an
unprivileged user in a throw-away directory, CPU / memory / process / file-size limits, a wall-clock
timeout). The tool's ``config`` holds :class:`~rlvr.sandbox.SandboxConfig` fields, e.g.
``{"wall_timeout_s": 5, "memory_bytes": 1073741824}``. The config check of a run whose tools file
lists this tool starts its sandbox, so a sandbox that cannot work there is a config error.

The model sees stdout; a program that fails shows the last lines of stderr too, and a program
stopped by a limit says which limit.
"""

from __future__ import annotations

from typing import Any

from rlvr.agent.tools.base import BaseTool, ToolResponse, function_schema
from rlvr.sandbox import LocalSandbox, SandboxResult
from rlvr.sandbox.config import sandbox_config

__all__ = ["PythonInterpreterTool", "describe_result"]

STDERR_TAIL_CHARS = 500


def describe_result(result: SandboxResult) -> str:
    """The text the model sees for one sandbox run."""
    if result.status == "ok":
        return result.stdout if result.stdout.strip() else "(the program printed nothing; use print())"
    if result.status == "timeout":
        return f"{result.stdout}Error: the program ran out of time ({result.wall_time_s:.1f} s) and was stopped"
    if result.status == "killed":
        return f"{result.stdout}Error: the program was stopped by a resource limit (exit code {result.exit_code})"
    if result.status == "sandbox_error":
        return "Error: the sandbox could not run the program"
    return f"{result.stdout}{result.stderr[-STDERR_TAIL_CHARS:]}"


class PythonInterpreterTool(BaseTool):
    """``python(code)``: run a Python program in the sandbox and return its output."""

    def __init__(self, config: dict[str, Any] | None = None, tool_schema: dict[str, Any] | None = None) -> None:
        super().__init__(config, tool_schema)
        self.sandbox = LocalSandbox(sandbox_config(self.config, "python tool config"))

    @classmethod
    def default_schema(cls) -> dict[str, Any]:
        return function_schema(
            "python", "Run a Python program and return what it prints to stdout.",
            {"code": {"type": "string", "description": "the program; print() the results you need"}}, ["code"])

    def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
                ) -> tuple[ToolResponse, float, dict[str, Any]]:
        arguments = self.check_arguments(parameters)
        result = self.sandbox.run(str(arguments["code"]))
        return ToolResponse(describe_result(result)), 0.0, {"sandbox_status": result.status,
                                                            "sandbox_wall_s": result.wall_time_s}
