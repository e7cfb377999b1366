"""rlvr's OpenAI-compatible endpoint and the ``openai_agent`` loop: agents written elsewhere, against
the plain OpenAI API, trained on the exact tokens of their conversations (see
:mod:`rlvr.agent.openai_endpoint.loop`)."""

from rlvr.agent.openai_endpoint.loop import OpenAIAgentLoop, load_agent_function

__all__ = ["OpenAIAgentLoop", "load_agent_function"]
