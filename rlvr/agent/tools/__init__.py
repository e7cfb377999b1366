"""Tools the model can call in a ``tool_agent`` rollout, configured from a YAML file (verl's format)::

    tools:
      - class_name: rlvr.agent.tools.calculator.CalculatorTool
        config: {}
      - class_name: rlvr.agent.tools.python_interpreter.PythonInterpreterTool
        config: {wall_timeout_s: 5}
        tool_schema:            # optional: replaces the class's default schema
          type: function
          function: {name: python, description: "...", parameters: {...}}

``class_name`` is the import path of a :class:`BaseTool` subclass (your own tools work the same way;
``my_pkg.tools:MyTool`` and ``tools.py:MyTool`` are accepted too). A module of your own is found from
the directory the command runs in, in the driver and in the workers (see :mod:`rlvr.utils.user_code`).
Point ``actor_rollout_ref.rollout.multi_turn.tool_config_path`` at the file.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import yaml

from rlvr.agent.tools.base import BaseTool, ToolArgumentError, ToolResponse, function_schema
from rlvr.utils.user_code import UserCodeError, is_object_path, load_object

__all__ = ["BaseTool", "ToolArgumentError", "ToolResponse", "function_schema", "load_tools", "tools_from_specs"]


def _import_class(class_name: str, where: str) -> type:
    """The class at ``pkg.module.Class`` (verl's form) or the object path ``pkg.module:Class`` /
    ``file.py:Class`` (:func:`rlvr.utils.user_code.load_object`)."""
    if is_object_path(class_name):
        try:
            cls = load_object(class_name)
        except UserCodeError as err:
            raise ValueError(f"{where}: {err}") from None
    else:
        module_name, _, attribute = str(class_name).rpartition(".")
        if not module_name:
            raise ValueError(f"{where}: class_name {class_name!r} must be a full import path such as "
                             "'rlvr.agent.tools.calculator.CalculatorTool' or 'my_pkg.tools:MyTool'")
        try:
            cls = getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError) as err:
            raise ValueError(f"{where}: cannot import {class_name!r} ({err})") from None
    if not (isinstance(cls, type) and issubclass(cls, BaseTool)):
        raise ValueError(f"{where}: {class_name!r} is not a subclass of rlvr.agent.tools.BaseTool")
    return cls


def tools_from_specs(specs: Any, where: str = "tools") -> dict[str, BaseTool]:
    """Build tools from a list of ``{"class_name", "config", "tool_schema"}`` mappings; ``{name: tool}``.

    Raises:
        ValueError: a malformed entry, a class that cannot be imported, or two tools with one name.
    """
    if not isinstance(specs, list) or not specs:
        raise ValueError(f"{where}: expected a non-empty list of tools, got {specs!r}")
    tools: dict[str, BaseTool] = {}
    for index, spec in enumerate(specs):
        entry = f"{where}[{index}]"
        if not isinstance(spec, dict) or "class_name" not in spec:
            raise ValueError(f"{entry}: each tool needs a class_name (and optionally config, tool_schema)")
        unknown = sorted(set(spec) - {"class_name", "config", "tool_schema"})
        if unknown:
            raise ValueError(f"{entry}: unknown key(s) {unknown}; use class_name, config, tool_schema")
        tool = _import_class(spec["class_name"], entry)(spec.get("config") or {}, spec.get("tool_schema"))
        if tool.name in tools:
            raise ValueError(f"{entry}: a second tool named {tool.name!r}; tool names must be unique")
        tools[tool.name] = tool
    return tools


def load_tools(path: str | Path) -> dict[str, BaseTool]:
    """The tools of a YAML tools file (see the module docstring); ``{name: tool}``.

    Raises:
        ValueError: the file is missing or malformed (the message names the entry).
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"tools file {str(path)!r} does not exist")
    content = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(content, dict) or "tools" not in content:
        raise ValueError(f"{path}: expected a mapping with a 'tools' list at the top")
    return tools_from_specs(content["tools"], where=f"{path}: tools")
