"""The ``tool_agent`` loop: the model calls tools between its turns.

Each model turn is read by the tool-call parser (``multi_turn.format``). A turn without a call ends
the trajectory (the model answered). Otherwise the calls of every sample that asked for one run at
once, bounded by ``multi_turn.tool_timeout_s``, and each result is inserted as a ``tool`` message
(cut to ``multi_turn.max_tool_response_tokens`` tokens) before the model's next turn. With
``multi_turn.stop_after_tool_call`` a turn ends right after a complete call (the parser's stop
strings), so the model cannot go on to invent the result.

Anything that goes wrong with a call - malformed JSON, an unknown tool, bad arguments, a tool that
raises or hangs - becomes an ``Error: ...`` message for the model and a counted metric, never a
crash. Per trajectory, each tool that was used gets ``create`` (with the row's
``extra_info["tools_kwargs"][<tool>]["create_kwargs"]``, as in verl) before its first call, and
``calc_reward`` and ``release`` at the end; step rewards (from ``execute``) and the final
``calc_reward`` go into ``turn_scores``.

Counters (``agent/<name>``, per-sample means): ``tool_calls``, ``tool_errors`` (every failed call),
``malformed_tool_calls``, ``tool_timeouts``, ``tool_responses_truncated``, ``observation_tokens``;
``agent/tool_time_s`` is the wall time spent waiting for tools in the call, and each numeric metric a
tool's ``execute`` returns is ``agent/tool/<tool>/<metric>``, its mean over the calls that returned it.
A call abandoned after its timeout keeps its tool instance until it returns (see ``_Session``).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from transformers import PreTrainedTokenizerBase, ProcessorMixin

from rlvr.agent.loop import expand_samples, register_agent_loop
from rlvr.agent.metrics import trajectory_metrics
from rlvr.agent.multi_turn import Reply, TurnDriver, TurnLimits
from rlvr.agent.tool_parser import ParsedTurn, ToolCall, get_tool_parser
from rlvr.agent.tools import BaseTool, ToolArgumentError, ToolResponse, load_tools
from rlvr.agent.tools.executor import CallOutcome, run_with_timeout
from rlvr.agent.trajectory import Trajectory
from rlvr.protocol import DataProto
from rlvr.workers.rollout.base import RolloutEngine, tokenizer_ids

__all__ = ["ToolAgentLoop", "truncate_text"]

TRUNCATED = " ...(truncated)"


def truncate_text(tokenizer: PreTrainedTokenizerBase, text: str, max_tokens: int, side: str = "right"
                  ) -> tuple[str, bool]:
    """``text`` cut to ``max_tokens`` tokens, and whether it was cut. ``side`` is where the cut is
    (``multi_turn.tool_response_truncate_side``, verl's names): ``right`` keeps the start (marker
    after it), ``left`` keeps the end (marker before it), ``middle`` keeps both ends (marker between)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) <= max_tokens:
        return text, False

    def decode(part: list[int]) -> str:
        return tokenizer.decode(part, skip_special_tokens=True)

    if side == "left":
        return TRUNCATED.strip() + " " + decode(ids[len(ids) - max_tokens:]), True
    if side == "middle":
        head = max_tokens // 2
        return decode(ids[:head]) + TRUNCATED + " " + decode(ids[len(ids) - (max_tokens - head):]), True
    return decode(ids[:max_tokens]) + TRUNCATED, True


def _row_kwargs(extra_info: Any, tool_name: str) -> dict:
    """The row's ``create_kwargs`` for ``tool_name`` (``extra_info["tools_kwargs"]``, verl's layout)."""
    tools_kwargs = (extra_info or {}).get("tools_kwargs") or {}
    return dict((tools_kwargs.get(tool_name) or {}).get("create_kwargs") or {})


@dataclass(frozen=True)
class CallResult:
    """One tool call's answer: the text for the model, its step reward, whether it failed, and the
    tool's numeric metrics as ``{"<tool>/<metric>": value}``."""

    text: str
    reward: float = 0.0
    failed: bool = False
    metrics: dict[str, float] = field(default_factory=dict)


class _Session:
    """The tool instances one ``generate_sequences`` call opened: ``(row, tool name) -> instance id``.

    Calls run in worker threads that a timeout may abandon, so the session keeps count of the calls
    still running on each instance (``busy``; calls on one instance run one at a time, ``key_locks``).
    :meth:`close` asks ``calc_reward`` of and releases every idle instance; an instance with a call
    still running is released by that call's thread when the tool returns (without ``calc_reward``:
    its trajectory is finished by then), and a call that has not started ``execute`` by ``close``
    creates and runs nothing. So every created instance is released exactly once and never while it
    executes; ``close`` itself waits for no call. The instance of a tool that never returns is never
    released (its daemon thread ends with the process).
    """

    def __init__(self, tools: dict[str, BaseTool], extra_infos: Any) -> None:
        self.tools = tools
        self.extra_infos = extra_infos
        self.instances: dict[tuple[int, str], str] = {}
        self.busy: dict[tuple[int, str], int] = {}
        self.key_locks: dict[tuple[int, str], threading.Lock] = {}
        self.lock = threading.Lock()
        self.closed = False
        self.call_metrics: dict[str, list[float]] = {}  # "<tool>/<metric>" -> one value per call that gave it

    def run_calls(self, row: int, calls: list[ToolCall]) -> list[CallResult]:
        """Run one row's calls in order (inside a worker thread)."""
        results = []
        for call in calls:
            if call.name not in self.tools:
                results.append(CallResult(f"Error: unknown tool {call.name!r}; available tools: "
                                          f"{', '.join(self.tools)}", failed=True))
                continue
            try:
                response, reward, metrics = self._execute((row, call.name), call.arguments)
            except ToolArgumentError as err:
                results.append(CallResult(f"Error: {err}", failed=True))
            except Exception as err:  # noqa: BLE001 - a failing tool becomes an error message for the model
                results.append(CallResult(f"Error: the tool failed: {type(err).__name__}: {err}", failed=True))
            else:
                numeric = {f"{call.name}/{key}": float(value) for key, value in metrics.items()
                           if isinstance(value, (int, float))}
                results.append(CallResult(response.text, float(reward), False, numeric))
        return results

    def _execute(self, key: tuple[int, str], arguments: dict[str, Any]) -> tuple[ToolResponse, float, dict[str, Any]]:
        """``execute`` on the key's instance (``create`` it first if needed), counted in ``busy``.

        Raises:
            RuntimeError: the session closed before the call got to run (nothing is created or run).
        """
        tool = self.tools[key[1]]
        with self.lock:
            if self.closed:
                raise RuntimeError("the rollout finished before this call started")
            self.busy[key] = self.busy.get(key, 0) + 1
            key_lock = self.key_locks.setdefault(key, threading.Lock())
        try:
            with key_lock:
                with self.lock:
                    if self.closed:  # it waited for an abandoned call on the same instance
                        raise RuntimeError("the rollout finished before this call started")
                    instance = self.instances.get(key)
                if instance is None:
                    instance = tool.create(None, **_row_kwargs(self.extra_infos[key[0]], key[1]))
                    with self.lock:
                        self.instances[key] = instance
                return tool.execute(instance, arguments)
        finally:
            with self.lock:
                self.busy[key] -= 1
                orphan = self.instances.pop(key, None) if self.closed and not self.busy[key] else None
            if orphan is not None:  # the session closed while this call ran: release now that it is done
                tool.release(orphan)

    def close(self, items: list[Trajectory], timeout_s: float) -> None:
        """``calc_reward`` (onto each trajectory's last sampled token) and ``release`` every idle
        instance; the busy ones are left to their running calls (see the class docstring)."""
        with self.lock:
            self.closed = True
            idle = {key: instance for key, instance in self.instances.items() if not self.busy.get(key)}
            for key in idle:
                del self.instances[key]

        def finish(key: tuple[int, str]) -> float:
            tool = self.tools[key[1]]
            try:
                return float(tool.calc_reward(idle[key]))
            finally:
                tool.release(idle[key])

        outcomes = run_with_timeout([lambda key=key: finish(key) for key in idle], timeout_s, "tool-release")
        for (row, _), outcome in zip(idle, outcomes):
            if outcome.status == "ok":
                items[row].reward_last_token(outcome.value)
            else:
                items[row].count("tool_errors")


TOOL_COUNTERS = ("tool_calls", "tool_errors", "malformed_tool_calls", "tool_timeouts", "tool_responses_truncated",
                 "observation_tokens")
"""The counters the tool loop reports every step (see the module docstring)."""


@register_agent_loop("tool_agent")
class ToolAgentLoop:
    """Multi-turn rollouts with tool calls (see the module docstring).

    Args:
        rollout_config: the ``actor_rollout_ref.rollout`` section (``multi_turn`` settings, lengths).
        tokenizer: the policy's tokenizer (chat template, decoding turns for the parser).
        processor: the model's multimodal processor or None; tool results are text (a prompt's own
            images reach the model through the batch either way).

    Raises:
        ValueError: no ``multi_turn.tool_config_path``, or a bad tools file.
    """

    def __init__(self, rollout_config: Any, tokenizer: PreTrainedTokenizerBase,
                 processor: ProcessorMixin | None = None) -> None:
        settings = rollout_config.multi_turn
        if not settings.tool_config_path:
            raise ValueError("the tool_agent loop needs actor_rollout_ref.rollout.multi_turn.tool_config_path "
                             "(a YAML file of tools, see rlvr.agent.tools)")
        self.settings = settings
        self.tokenizer = tokenizer
        self.tools = load_tools(settings.tool_config_path)
        self.parser = get_tool_parser(settings.format)
        self.stop = list(self.parser.stop) if settings.stop_after_tool_call else []
        eos_ids, pad_id = tokenizer_ids(tokenizer)
        limits = TurnLimits.of(rollout_config)
        self.driver = TurnDriver(tokenizer, limits, eos_ids, pad_id, processor)

    def generate_sequences(self, engine: RolloutEngine, prompts: DataProto) -> DataProto:
        prompts = expand_samples(prompts)
        extra_infos = prompts.non_tensor_batch.get("extra_info", [None] * len(prompts))
        session = _Session(self.tools, extra_infos)
        waited = [0.0]

        def respond(rows: list[int], items: list[Trajectory], texts: list[str], may_continue: list[bool]
                    ) -> list[Reply]:
            start = time.perf_counter()
            replies = self._respond(session, rows, items, texts, may_continue)
            waited[0] += time.perf_counter() - start
            return replies

        batch, engine_meta = self.driver.run(engine, prompts, respond, self.stop)
        session.close(batch.items, float(self.settings.tool_timeout_s))
        metrics = {**trajectory_metrics(batch, TOOL_COUNTERS), "agent/tool_time_s": waited[0],
                   **{f"agent/tool/{name}": float(np.mean(values)) for name, values in session.call_metrics.items()}}
        return batch.to_output(prompts, self.driver.limits.response_length, {**engine_meta, "metrics": metrics})

    def _respond(self, session: _Session, rows: list[int], items: list[Trajectory], texts: list[str],
                 may_continue: list[bool]) -> list[Reply]:
        """Parse every finished turn, run the calls of the rows that may go on, build the replies."""
        parsed = [self.parser.parse(text) for text in texts]
        runnable = [k for k, turn in enumerate(parsed) if turn.calls and may_continue[k]]
        limit = int(self.settings.max_parallel_calls)
        outcomes = run_with_timeout([lambda k=k: session.run_calls(rows[k], parsed[k].calls[:limit]) for k in runnable],
                                    float(self.settings.tool_timeout_s), "tool")
        outcome_of = dict(zip(runnable, outcomes))
        return [self._reply(session, item, turn, outcome_of.get(k)) if more else Reply(done=not turn.wants_tools)
                for k, (item, turn, more) in enumerate(zip(items, parsed, may_continue))]

    def _reply(self, session: _Session, item: Trajectory, turn: ParsedTurn, outcome: CallOutcome | None) -> Reply:
        """The tool messages for one turn that may go on (and the counters, and the calls' metrics
        into ``session.call_metrics``); ``done`` when the turn made no call. ``outcome`` is the run
        of the turn's well-formed calls (None without any)."""
        if not turn.wants_tools:
            return Reply(done=True)
        item.count("tool_calls", len(turn.calls) + len(turn.errors))
        item.count("malformed_tool_calls", len(turn.errors))
        item.count("tool_errors", len(turn.errors))
        texts = [f"Error: {error}" for error in turn.errors]
        reward = 0.0
        limit = int(self.settings.max_parallel_calls)
        if outcome is not None and outcome.status == "ok":
            for result in outcome.value:
                item.count("tool_errors", float(result.failed))
                texts.append(result.text)
                reward += result.reward
                for name, value in result.metrics.items():
                    session.call_metrics.setdefault(name, []).append(value)
        elif outcome is not None:
            timed_out = outcome.status == "timeout"
            item.count("tool_timeouts", float(timed_out))
            item.count("tool_errors", len(turn.calls[:limit]))
            why = f"did not answer within {self.settings.tool_timeout_s:g} s" if timed_out else \
                f"failed: {type(outcome.error).__name__}: {outcome.error}"
            texts += [f"Error: the tool {why}"] * len(turn.calls[:limit])
        extra = len(turn.calls) - limit
        if extra > 0:
            item.count("tool_errors", extra)
            texts += [f"Error: only {limit} tool call(s) per turn; call the others in a later turn"] * extra
        return Reply(messages=[self._tool_message(item, text) for text in texts], reward=reward)

    def _tool_message(self, item: Trajectory, text: str) -> dict[str, str]:
        cut, truncated = truncate_text(self.tokenizer, text, int(self.settings.max_tool_response_tokens),
                                       str(self.settings.tool_response_truncate_side))
        item.count("tool_responses_truncated", float(truncated))
        return {"role": "tool", "content": cut}
