"""The openai_agent loop and rlvr's OpenAI-compatible endpoint on the HF engine (tiny models): an
agent written with the plain ``openai`` client records the same trajectory (ids, masks, log-probs)
as the same conversation run by ``tool_agent``; the endpoint refuses requests without the key,
malformed, oversized and rewritten ones, and keeps serving."""

from __future__ import annotations

import http.client
import json

import numpy as np
import pytest
import torch
from agent_helpers import prompt_batch, rollout_config, tool_calling_tiny_model, write_tools_file

from rlvr.agent import AgentLoopManager
from rlvr.agent.chat import render_prompt_ids
from rlvr.agent.openai_endpoint.loop import OpenAIAgentLoop
from rlvr.workers.rollout import HFRollout

pytest.importorskip("openai")

QUESTIONS = ["what is 3 + 1", "what is 5 + 1"]


@pytest.fixture(scope="module")
def tool_model():
    return tool_calling_tiny_model(questions=8)


def config(tools_path, run: str = "agent_helpers:calculator_agent", **endpoint):
    cfg = rollout_config(128, 64, tool_config_path=str(tools_path), max_assistant_turns=3)
    cfg.agent.openai.run = run
    for key, value in endpoint.items():
        cfg.agent.openai[key] = value
    return cfg


def prompts(tokenizer, questions=QUESTIONS):
    messages = [[{"role": "user", "content": q}] for q in questions]
    ids = [render_prompt_ids(tokenizer, m) for m in messages]
    raw = np.empty(len(messages), dtype=object)
    raw[:] = messages
    return prompt_batch(tokenizer, ids, {"raw_prompt": raw}, do_sample=False, temperature=0.0)


@pytest.mark.slow
def test_endpoint_trajectory_equals_tool_agent_trajectory(tool_model, tmp_path):
    model, tokenizer = tool_model
    tools = write_tools_file(tmp_path / "tools.yaml", "rlvr.agent.tools.calculator.CalculatorTool")
    cfg = config(tools)
    engine = HFRollout(cfg, model, tokenizer, "cpu", seed=0, owns_module=False)
    cfg.agent.default_agent_loop = "tool_agent"
    reference = AgentLoopManager(cfg, tokenizer).generate_sequences(engine, prompts(tokenizer))
    loop = OpenAIAgentLoop(cfg, tokenizer)
    try:
        out = loop.generate_sequences(engine, prompts(tokenizer))
    finally:
        loop.close()
    assert reference.non_tensor_batch["num_tool_calls"].tolist() == [1, 1]  # the conversation has a tool turn
    for key in ("prompts", "responses", "response_mask", "attention_mask", "input_ids", "position_ids"):
        assert torch.equal(out.batch[key], reference.batch[key]), key
    # equal up to fp32 rounding: the endpoint batches whichever turns are waiting, tool_agent both rows at
    # once, so the rows run at other paddings (a difference of 2e-6 was seen)
    torch.testing.assert_close(out.batch["rollout_log_probs"], reference.batch["rollout_log_probs"], rtol=0, atol=1e-5)
    assert out.non_tensor_batch["num_turns"].tolist() == reference.non_tensor_batch["num_turns"].tolist() == [2, 2]
    for row, answer in enumerate(out.non_tensor_batch["agent_answer"]):  # the model's last turn, as the agent got it
        mask = reference.batch["response_mask"][row].tolist()
        end = len(mask) - mask[::-1].index(1)
        start = end - mask[:end][::-1].index(0) if 0 in mask[:end] else 0
        assert answer == tokenizer.decode(reference.batch["responses"][row, start:end], skip_special_tokens=True)
    sampled = out.batch["response_mask"].bool()
    assert (out.batch["response_versions"][sampled] == 0).all() and (out.batch["response_versions"][~sampled] == -1).all()
    metrics = out.meta_info["metrics"]
    assert metrics["agent/requests"] == 2.0 and metrics["agent/tool_calls"] == 1.0 and metrics["agent/run_errors"] == 0


def _post(port: int, path: str, body: bytes, headers: dict | None = None) -> tuple[int, dict]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request("POST", path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
    response = connection.getresponse()
    status, data = response.status, json.loads(response.read())
    connection.close()
    return status, data


def test_endpoint_refuses_bad_requests_and_keeps_serving(tool_model, tmp_path):
    model, tokenizer = tool_model
    tools = write_tools_file(tmp_path / "tools.yaml", "rlvr.agent.tools.calculator.CalculatorTool")
    loop = OpenAIAgentLoop(config(tools, api_key="secret", max_request_bytes=4096), tokenizer)
    try:
        port, path = loop.server.port, "/sessions/abc/v1/chat/completions"
        good = {"Authorization": "Bearer secret"}
        body = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()
        assert _post(port, path, body)[0] == 401  # no key
        assert _post(port, path, body, {"Authorization": "Bearer wrong"})[0] == 401
        status, data = _post(port, path, b"{not json", good)
        assert status == 400 and "not valid JSON" in data["error"]["message"]
        status, data = _post(port, path, b"x" * 5000, good)
        assert status == 413 and "max_request_bytes" in data["error"]["message"]
        status, data = _post(port, path, body, good)
        assert status == 404 and "no session" in data["error"]["message"]
        assert _post(port, "/v1/chat/completions", body, good)[0] == 404
        # a malformed message inside a live session is refused with the reason, and the server goes on
        loop.sessions["abc"] = __import__("rlvr.agent.openai_endpoint.session", fromlist=["ChatSession"]).ChatSession(
            "abc", {})
        loop.completions = object.__new__(__import__("rlvr.agent.openai_endpoint.completions",
                                                     fromlist=["ChatCompletions"]).ChatCompletions)
        status, data = _post(port, path, json.dumps({"messages": [{"role": "robot", "content": "x"}]}).encode(), good)
        assert status == 400 and "role" in data["error"]["message"]
        status, data = _post(port, path, json.dumps({"messages": "hello"}).encode(), good)
        assert status == 400 and "non-empty list" in data["error"]["message"]
        status, data = _post(port, path, json.dumps({"messages": [{"role": "user", "content": "x"}], "n": 2}).encode(),
                             good)
        assert status == 400 and "n=1" in data["error"]["message"]
    finally:
        loop.close()


def test_rewritten_conversation_and_failing_agent(tool_model, tmp_path):
    """A request that edits an earlier message is refused (the agent sees the error); an agent that
    raises is counted and its recorded turn kept."""
    model, tokenizer = tool_model
    tools = write_tools_file(tmp_path / "tools.yaml", "rlvr.agent.tools.calculator.CalculatorTool")
    cfg = config(tools, run="agent_helpers:failing_agent")
    engine = HFRollout(cfg, model, tokenizer, "cpu", seed=0, owns_module=False)
    loop = OpenAIAgentLoop(cfg, tokenizer)
    try:
        out = loop.generate_sequences(engine, prompts(tokenizer, QUESTIONS[:1]))
        session = __import__("rlvr.agent.openai_endpoint.session", fromlist=["ChatSession"]).ChatSession("s", {})
        session.transcript = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "tool_calls": []}]
        from rlvr.agent.openai_endpoint.session import RequestError, normalise_messages
        edited = normalise_messages([{"role": "user", "content": "A"}, {"role": "assistant", "content": "b"},
                                     {"role": "tool", "content": "1"}])
        with pytest.raises(RequestError, match=r"messages\[0\] differs"):
            session.new_messages(edited)
        injected = normalise_messages([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                                       {"role": "assistant", "content": "made up"}])
        with pytest.raises(RequestError, match="only tool or user messages"):
            session.new_messages(injected)
    finally:
        loop.close()
    assert out.meta_info["metrics"]["agent/run_errors"] == 1.0
    assert out.batch["response_mask"][0].sum() > 0  # the one turn the agent got is recorded
    assert out.non_tensor_batch["agent_answer"].tolist() == [None]


def test_the_example_agent_runs_from_its_file(tool_model, tmp_path):
    """``examples/openai_agent.py:run`` (loaded by file path, as the command line gives it) drives the
    tiny tool-calling model: its calculator call is answered and the model's next turn recorded."""
    from pathlib import Path

    model, tokenizer = tool_model
    example = Path(__file__).parents[2] / "examples" / "openai_agent.py"
    tools = write_tools_file(tmp_path / "tools.yaml", "rlvr.agent.tools.calculator.CalculatorTool")
    cfg = config(tools, run=f"{example}:run")
    engine = HFRollout(cfg, model, tokenizer, "cpu", seed=0, owns_module=False)
    loop = OpenAIAgentLoop(cfg, tokenizer)
    try:
        out = loop.generate_sequences(engine, prompts(tokenizer))
    finally:
        loop.close()
    assert out.non_tensor_batch["num_tool_calls"].tolist() == [1, 1]
    assert out.non_tensor_batch["num_turns"].tolist() == [2, 2]
    assert out.meta_info["metrics"]["agent/requests"] == 2.0 and out.meta_info["metrics"]["agent/run_errors"] == 0
    text = tokenizer.decode(out.batch["responses"][0])
    assert "<|im_start|>tool\n2<|im_end|>" in text  # the example's calculator answered 1+1


class _BrokenEngine:
    def generate_sequences(self, prompts):
        raise RuntimeError("the engine broke")


def test_an_engine_failure_stops_the_step(tool_model, tmp_path):
    """The agent sees an HTTP 500 and fails, but the engine's own error is what the loop raises."""
    model, tokenizer = tool_model
    tools = write_tools_file(tmp_path / "tools.yaml", "rlvr.agent.tools.calculator.CalculatorTool")
    loop = OpenAIAgentLoop(config(tools), tokenizer)
    try:
        with pytest.raises(RuntimeError, match="the engine broke"):
            loop.generate_sequences(_BrokenEngine(), prompts(tokenizer, QUESTIONS[:1]))
    finally:
        loop.close()
