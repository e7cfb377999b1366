"""Agent loops above the rollout engines: single-turn, tool calling and gym-style environments.

See :mod:`rlvr.agent.loop` (the registry and :class:`AgentLoopManager`), :mod:`rlvr.agent.tool_agent`,
:mod:`rlvr.agent.env_agent`, :mod:`rlvr.agent.openai_endpoint`, :mod:`rlvr.agent.tools` and :mod:`rlvr.agent.tool_parser`.
"""

from rlvr.agent.env_agent import ENVIRONMENTS, EnvAgentLoop, Environment, RetryEnvironment, register_environment
from rlvr.agent.loop import AGENT_LOOPS, AgentLoop, AgentLoopManager, SingleTurnAgentLoop, get_agent_loop, register_agent_loop
from rlvr.agent.openai_endpoint import OpenAIAgentLoop
from rlvr.agent.tool_agent import ToolAgentLoop
from rlvr.agent.tool_parser import TOOL_PARSERS, ToolCall, get_tool_parser, register_tool_parser

__all__ = [
    "AGENT_LOOPS",
    "ENVIRONMENTS",
    "TOOL_PARSERS",
    "AgentLoop",
    "AgentLoopManager",
    "EnvAgentLoop",
    "OpenAIAgentLoop",
    "Environment",
    "RetryEnvironment",
    "SingleTurnAgentLoop",
    "ToolAgentLoop",
    "ToolCall",
    "get_agent_loop",
    "get_tool_parser",
    "register_agent_loop",
    "register_environment",
    "register_tool_parser",
]
