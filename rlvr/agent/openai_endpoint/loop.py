"""The ``openai_agent`` loop: agents written against the OpenAI API, trained like ``tool_agent``.

The agent is a plain function ``run(client, row) -> answer`` (``rollout.agent.openai.run``):
``client`` is an ``openai.OpenAI`` client whose ``base_url`` is this sample's session on rlvr's
endpoint, ``row`` the sample's data row (``raw_prompt`` messages, ``reward_model``, ``extra_info``,
...). The function talks to the model through ``client.chat.completions.create`` (with tools, as
many calls as it likes) and runs its own tools; rlvr records the conversation as token ids
(:mod:`rlvr.agent.openai_endpoint.session`) and hands the trainer the same batch as ``tool_agent``:
``responses`` = every model turn (mask 1, with log-probs) and the inserted messages (mask 0),
``turn_scores`` zero, and ``response_versions`` (the weights version of every sampled token, -1 on
inserted ones). The reward is computed by the reward manager on the decoded response, as for any
other loop; the function's return value is kept as the non-tensor field ``agent_answer``.

One generation call runs every sample's function in its own thread (at most
``max_concurrent_runs`` at once), each within ``run_timeout_s``: when time is up its session is
closed (its later requests are refused) and its trajectory is kept as it is. A function that raises
is counted (``agent/run_errors``), never fatal; so is one that timed out (``agent/run_timeouts``). An
error of the rollout engine itself (a stale replica, no replica up) is raised after the agents ran.
"""

from __future__ import annotations

import importlib
import importlib.util
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from transformers import PreTrainedTokenizerBase

from rlvr.agent.loop import expand_samples, register_agent_loop
from rlvr.agent.metrics import trajectory_metrics
from rlvr.agent.openai_endpoint.completions import MODEL_NAME, ChatCompletions
from rlvr.agent.openai_endpoint.http_server import EndpointServer
from rlvr.agent.openai_endpoint.session import ChatSession, RequestError
from rlvr.agent.openai_endpoint.turns import TurnBatcher
from rlvr.agent.trajectory import Trajectory, TrajectoryBatch
from rlvr.protocol import DataProto
from rlvr.utils.net import require_key_off_loopback
from rlvr.workers.rollout.base import RolloutEngine, tokenizer_ids

__all__ = ["OpenAIAgentLoop", "load_agent_function"]

COUNTERS = ("tool_calls", "malformed_tool_calls", "observation_tokens", "tool_responses_truncated", "requests",
            "run_errors", "run_timeouts")
AgentFunction = Callable[[Any, dict], Any]


def load_agent_function(spec: str) -> AgentFunction:
    """The function named by ``'package.module:function'`` or ``'path/to/file.py:function'``.

    Raises:
        ValueError: the spec has no ``:``, the module or file cannot be imported, or has no such function.
    """
    target, _, name = str(spec).rpartition(":")
    if not target or not name:
        raise ValueError(f"rollout.agent.openai.run={spec!r} must be 'package.module:function' or "
                         "'path/to/file.py:function'")
    if target.endswith(".py"):
        path = Path(target).resolve()
        if not path.is_file():
            raise ValueError(f"rollout.agent.openai.run: {target!r} is not a file")
        module_spec = importlib.util.spec_from_file_location(f"rlvr_agent_{path.stem}", path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    function = getattr(module, name, None)
    if not callable(function):
        raise ValueError(f"rollout.agent.openai.run: {target!r} has no function {name!r}")
    return function


@register_agent_loop("openai_agent")
class OpenAIAgentLoop:
    """Runs ``run(client, row)`` per sample against rlvr's endpoint (see the module docstring).

    Args:
        rollout_config: the ``rollout`` section (``agent.openai``, ``multi_turn``, lengths).
        tokenizer: the policy's tokenizer and chat template.

    Raises:
        ValueError: no or a broken ``agent.openai.run``.
    """

    def __init__(self, rollout_config: Any, tokenizer: PreTrainedTokenizerBase) -> None:
        import openai  # the agent's client; imported here so that rlvr runs without it

        self._openai = openai
        self.rollout_config, self.tokenizer = rollout_config, tokenizer
        self.settings = rollout_config.agent.openai
        if not self.settings.run:
            raise ValueError("the openai_agent loop needs actor_rollout_ref.rollout.agent.openai.run: the agent "
                             "function run(client, row) -> answer, as 'package.module:function' or 'file.py:function'")
        self.run_function = load_agent_function(self.settings.run)
        require_key_off_loopback(str(self.settings.host), self.settings.api_key,
                                 "actor_rollout_ref.rollout.agent.openai.api_key", "rlvr's OpenAI-compatible endpoint")
        self.sessions: dict[str, ChatSession] = {}
        self.completions: ChatCompletions | None = None
        self.server = EndpointServer(str(self.settings.host), int(self.settings.port), self.settings.api_key,
                                     int(self.settings.max_request_bytes), self._handle)

    def close(self) -> None:
        self.server.close()

    def _handle(self, session_id: str, route: str, body: Any) -> dict:
        if route == "models":
            return {"object": "list", "data": [{"id": MODEL_NAME, "object": "model", "owned_by": "rlvr"}]}
        session = self.sessions.get(session_id)
        if session is None:
            raise RequestError(f"no session {session_id!r}: the base URL of a sample is only valid while its agent "
                               "runs", 404)
        completions = self.completions
        if completions is None:
            raise RequestError("no rollout is running", 409)
        return completions.complete(session, body)

    def generate_sequences(self, engine: RolloutEngine, prompts: DataProto) -> DataProto:
        prompts = expand_samples(prompts)
        eos_ids, pad_id = tokenizer_ids(self.tokenizer)
        meta = prompts.meta_info
        if meta.get("pad_token_id") is not None:
            pad_id = int(meta["pad_token_id"])
        batcher = TurnBatcher(engine, meta, pad_id)
        self.completions = ChatCompletions(self.rollout_config, self.tokenizer, batcher, eos_ids)
        rows = [{key: values[i] for key, values in prompts.non_tensor_batch.items()} for i in range(len(prompts))]
        sessions = [ChatSession(uuid.uuid4().hex, row) for row in rows]
        self.sessions.update({s.session_id: s for s in sessions})
        try:
            answers = self._run_agents(sessions)
        finally:
            for session in sessions:
                with session.lock:
                    session.closed = True
                self.sessions.pop(session.session_id, None)
            self.completions = None
            batcher.close()
        if batcher.error is not None:
            raise batcher.error
        return self._output(prompts, sessions, answers, {**batcher.engine_meta})

    def _run_agents(self, sessions: list[ChatSession]) -> list[Any]:
        """Every sample's agent function, ``max_concurrent_runs`` at a time, each within
        ``run_timeout_s``; returns their answers (None for one that failed or timed out)."""
        answers: list[Any] = [None] * len(sessions)
        slots = threading.Semaphore(int(self.settings.max_concurrent_runs))
        started: dict[int, float] = {}
        finished = [threading.Event() for _ in sessions]
        timeout = float(self.settings.run_timeout_s)

        def run(i: int) -> None:
            session = sessions[i]
            try:
                client = self._openai.OpenAI(base_url=self.server.base_url(session.session_id),
                                             api_key=self.settings.api_key or "no-key", max_retries=0, timeout=timeout)
                answers[i] = self.run_function(client, session.row)
            except Exception:  # noqa: BLE001 - a failing agent is counted, its trajectory kept
                self._count(session, "run_errors")
            finally:
                finished[i].set()
                slots.release()

        for i in range(len(sessions)):
            slots.acquire()
            started[i] = time.monotonic()
            threading.Thread(target=run, args=(i,), name=f"rlvr-agent-{i}", daemon=True).start()
        for i, done in enumerate(finished):
            if not done.wait(max(0.0, started[i] + timeout - time.monotonic())):
                with sessions[i].lock:
                    sessions[i].closed = True
                self._count(sessions[i], "run_timeouts")
        return answers

    @staticmethod
    def _count(session: ChatSession, name: str) -> None:
        if session.trajectory is None:
            session.trajectory = Trajectory(prompt_ids=[])
        session.trajectory.count(name)

    def _output(self, prompts: DataProto, sessions: list[ChatSession], answers: list[Any], engine_meta: dict
                ) -> DataProto:
        """The engine-contract output of the recorded trajectories (see :class:`TrajectoryBatch`)."""
        response_length = int(self.rollout_config.response_length)
        batch = TrajectoryBatch(prompts, int(prompts.meta_info.get("pad_token_id") or tokenizer_ids(self.tokenizer)[1]))
        for i, session in enumerate(sessions):
            trajectory = session.trajectory
            if trajectory is not None and trajectory.prompt_ids:  # an agent that never asked keeps the row's prompt
                batch.items[i] = trajectory
            else:
                batch.items[i].counts.update(trajectory.counts if trajectory else {})
            batch.items[i].count("requests", session.requests)
            if batch.items[i].stop_reason is None:
                batch.items[i].stop_reason = "answered"
        metrics = trajectory_metrics(batch, COUNTERS)
        output = batch.to_output(prompts, response_length, {**engine_meta, "metrics": metrics})
        output.non_tensor_batch["agent_answer"] = np.array([None if a is None else str(a) for a in answers],
                                                           dtype=object)
        return output
