"""``/v1/chat/completions`` over a session: render, generate, parse tool calls, answer.

The turn follows ``tool_agent`` exactly, so that a conversation run through the endpoint records
the same trajectory as the same conversation run by that loop: the same limits
(``rollout.response_length`` over all turns, ``multi_turn.max_assistant_turns`` model turns, each
turn within the context window), the same stop strings (the parser's, with
``multi_turn.stop_after_tool_call``, when the request declares ``tools``), the same tool-call parser
(``multi_turn.format``), inserted messages cut to ``multi_turn.max_tool_response_tokens``, and the
ids between turns from the chat template. When a limit is reached the answer is an empty assistant
message with ``finish_reason: "length"`` and the session's trajectory ends.

Sampling settings are the rollout's (the policy is trained on its own distribution): a request's
``temperature``, ``top_p`` and the like are ignored; ``max_tokens`` / ``max_completion_tokens`` and
``stop`` are honoured. ``n`` must be 1 and ``stream`` false.
"""

from __future__ import annotations

import json
import time
from typing import Any

from transformers import PreTrainedTokenizerBase

from rlvr.agent.chat import ChatTurns
from rlvr.agent.multi_turn import TurnLimits
from rlvr.agent.openai_endpoint.session import ChatSession, RequestError, normalise_messages
from rlvr.agent.openai_endpoint.turns import TurnBatcher, TurnRequest
from rlvr.agent.tool_agent import truncate_text
from rlvr.agent.tool_parser import ParsedTurn, get_tool_parser
from rlvr.agent.trajectory import Trajectory

__all__ = ["ChatCompletions", "MODEL_NAME"]

MODEL_NAME = "rlvr-policy"


def _options(body: dict) -> tuple[Any, int | None, list[str]]:
    """``(tools, max_tokens, stop)`` of a request, checked."""
    if body.get("stream"):
        raise RequestError("streaming is not supported; send stream=false")
    if body.get("n", 1) != 1:
        raise RequestError("only n=1 is supported (one agent conversation is one sample)")
    tools = body.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise RequestError("'tools' must be a list of tool objects")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1):
        raise RequestError("'max_tokens' must be a positive integer")
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise RequestError("'stop' must be a string or a list of non-empty strings")
    return tools or None, max_tokens, stop


class ChatCompletions:
    """Answers chat-completion requests of sessions (see the module docstring).

    Args:
        rollout_config: the ``rollout`` section (lengths, ``multi_turn``).
        tokenizer: the policy's tokenizer and chat template.
        batcher: runs the model turns.
        eos_ids: ids that end a model turn.
    """

    def __init__(self, rollout_config, tokenizer: PreTrainedTokenizerBase, batcher: TurnBatcher,
                 eos_ids: list[int]) -> None:
        settings = rollout_config.multi_turn
        self.tokenizer, self.batcher = tokenizer, batcher
        self.parser = get_tool_parser(settings.format)
        self.tool_stop = list(self.parser.stop) if settings.stop_after_tool_call else []
        self.max_inserted_tokens = int(settings.max_tool_response_tokens)
        self.truncate_side = str(settings.tool_response_truncate_side)
        self.limits = TurnLimits.of(rollout_config)
        self.response_length = int(rollout_config.response_length)
        self.prompt_length = int(rollout_config.prompt_length)
        self.eos_ids = set(eos_ids)
        self.chat = ChatTurns(tokenizer, eos_ids)

    def complete(self, session: ChatSession, body: dict) -> dict:
        """The answer to one request of ``session`` (its trajectory grows by the inserted messages
        and the model's turn).

        Raises:
            RequestError: a malformed request, a closed session, or a rewritten conversation.
        """
        messages = normalise_messages(body.get("messages"))
        tools, max_tokens, stop = _options(body)
        with session.lock:
            if session.closed:
                raise RequestError(f"session {session.session_id} is closed (its agent returned or ran out of time)",
                                   409)
            session.requests += 1
            if session.trajectory is None:
                self._start(session, body["messages"], messages, tools)
            elif not self._insert(session, messages):
                session.transcript.append({"role": "assistant", "content": "", "tool_calls": []})
                return self._answer(session, "", [], "length")
            trajectory = session.trajectory
            context = trajectory.prompt_ids + trajectory.response_ids
            length = min(self.response_length - len(trajectory.response_ids),
                         self.prompt_length + self.response_length - len(context), max_tokens or self.response_length)
            stops = tuple(dict.fromkeys(stop + (self.tool_stop if tools else [])))
            turn = self.batcher.submit(TurnRequest(context, length, stops, session.session_id)).result()
            trajectory.assistant_turns += 1
            session.add_sampled(turn.ids, turn.log_probs, turn.versions)
            text = self.tokenizer.decode(turn.ids, skip_special_tokens=True)
            parsed = self.parser.parse(text) if tools else ParsedTurn(content=text)
            trajectory.count("tool_calls", len(parsed.calls) + len(parsed.errors))
            trajectory.count("malformed_tool_calls", len(parsed.errors))
            if len(trajectory.response_ids) >= self.response_length:
                trajectory.stop_reason = "response_budget"
            ended = bool(turn.ids) and (turn.ids[-1] in self.eos_ids or self._ends_with(turn.ids, stops))
            finish = "tool_calls" if parsed.calls else ("stop" if ended or len(turn.ids) < length else "length")
            calls = [{"id": f"call_{session.requests}_{k}", "type": "function",
                      "function": {"name": call.name, "arguments": json.dumps(call.arguments)}}
                     for k, call in enumerate(parsed.calls)]
            session.transcript.append({"role": "assistant", "content": parsed.content,
                                       "tool_calls": [(c.name, c.arguments) for c in parsed.calls]})
            return self._answer(session, parsed.content, calls, finish)

    def _start(self, session: ChatSession, raw_messages: list, messages: list[dict], tools: Any) -> None:
        """The first request: its messages rendered with the chat template are the prompt."""
        extra = {"tools": tools} if tools else {}
        text = self.tokenizer.apply_chat_template(raw_messages, add_generation_prompt=True, tokenize=False, **extra)
        prompt_ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(prompt_ids) > self.prompt_length:
            session.closed = True
            raise RequestError(f"the conversation renders to {len(prompt_ids)} tokens, more than "
                               f"rollout.prompt_length={self.prompt_length} (data.max_prompt_length)")
        session.trajectory = Trajectory(prompt_ids=prompt_ids)
        session.transcript = list(messages)

    def _insert(self, session: ChatSession, messages: list[dict]) -> bool:
        """Insert a later request's new messages; False when the trajectory cannot go on (a limit)."""
        added = session.new_messages(messages)
        trajectory = session.trajectory
        session.transcript += added
        if trajectory.done:
            return False
        if not self.limits.may_continue(trajectory):
            trajectory.stop_reason = "turn_limit"
            return False
        cut = []
        for message in added:
            content, truncated = truncate_text(self.tokenizer, message["content"], self.max_inserted_tokens,
                                               self.truncate_side)
            trajectory.count("tool_responses_truncated", float(truncated))
            cut.append({"role": message["role"], "content": content})
        inserted = self.chat.after_turn(cut, last_token=trajectory.response_ids[-1] if trajectory.response_ids
                                        else None)
        if len(trajectory.response_ids) + len(inserted) >= self.response_length:
            trajectory.stop_reason = "response_budget"  # no room left for the model to answer
            return False
        session.add_inserted(inserted)
        trajectory.count("observation_tokens", len(inserted))
        trajectory.count("user_turns")
        return True

    def _ends_with(self, ids: list[int], stops: tuple[str, ...]) -> bool:
        if not stops:
            return False
        tail = self.tokenizer.decode(ids[-(max(len(s) for s in stops) + 2):], skip_special_tokens=False)
        return any(s in tail for s in stops)

    @staticmethod
    def _answer(session: ChatSession, content: str, calls: list[dict], finish: str) -> dict:
        trajectory = session.trajectory
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
        prompt_tokens = len(trajectory.prompt_ids) if trajectory else 0
        return {
            "id": f"chatcmpl-{session.session_id}-{session.requests}", "object": "chat.completion",
            "created": int(time.time()), "model": MODEL_NAME,
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(trajectory.response_ids) if trajectory
                      else 0, "total_tokens": prompt_tokens + (len(trajectory.response_ids) if trajectory else 0)},
        }
