"""An agent written with the plain ``openai`` client, trained by rlvr (the ``openai_agent`` loop).

rlvr calls ``run(client, row)`` once per sample. ``client`` is an ``openai.OpenAI`` client whose
``base_url`` is this sample's session on rlvr's OpenAI-compatible endpoint (served in front of the
rollout engine being trained); ``row`` is the data row (``raw_prompt`` holds the prompt's chat
messages). The agent below asks the model, runs every calculator call the model makes, sends the
results back and asks again, until the model answers without a call: several chat-completion calls
per sample. rlvr records every turn as the exact token ids the model sampled (with their log-probs)
and the tool results as inserted tokens, and trains on that, as it does for its own ``tool_agent``.

Train it on the tool-use job's data (three-digit products; ``make train-tools`` writes them):

    python -m rlvr.data_prep.tool_use --out data/tools
    rlvr --preset tool_job actor_rollout_ref.rollout.agent.default_agent_loop=openai_agent \\
        actor_rollout_ref.rollout.agent.openai.run=examples/openai_agent.py:run trainer.experiment_name=openai_agent

The same file works with any OpenAI-compatible server: point an ``openai.OpenAI`` client at it and
call ``run(client, row)`` yourself.
"""

from __future__ import annotations

import ast
import json
import operator

CALCULATOR = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression and return its value.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}

_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def calculate(expression: str) -> str:
    """The value of ``+ - * /`` arithmetic on numbers, as text (an error message for anything else)."""

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        raise ValueError("only numbers and + - * / are allowed")

    try:
        result = value(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError) as err:
        return f"Error: {err}"
    return str(int(result)) if float(result).is_integer() else f"{result:.12g}"


def run(client, row: dict, max_calls: int = 4) -> str:
    """Ask, run the calculator calls, ask again; return the model's final answer (see the module docstring)."""
    messages = [dict(message) for message in row["raw_prompt"]]
    for _ in range(max_calls):
        reply = client.chat.completions.create(model="rlvr-policy", messages=messages, tools=[CALCULATOR])
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls or reply.choices[0].finish_reason == "length":
            return message.content or ""
        for call in message.tool_calls:
            try:
                result = calculate(json.loads(call.function.arguments)["expression"])
            except (KeyError, TypeError, json.JSONDecodeError):
                result = 'Error: call the calculator with {"expression": "..."}'
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return messages[-1].get("content") or ""
