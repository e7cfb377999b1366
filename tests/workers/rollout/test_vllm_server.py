"""The server rollout engine against vLLM's real OpenAI server (``make test-vllm``): one managed replica
(API key set, bound to loopback) with a tiny model trained to call the calculator. In file order:
the endpoint's trajectories equal ``tool_agent``'s on the same engine; greedy generation equals the HF
engine's ids with fp32 log-probs; a request without the key is refused; a weight reload changes
generation and every token carries the new version; a killed replica is restarted and serves the
current weights. A server that does not start fails the tests (no skip once vLLM imports)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(3600)]  # a loaded 2-core machine took minutes to start one
pytest.importorskip("vllm")

sys.path.insert(0, str(Path(__file__).parents[2] / "agent"))
from agent_helpers import VLLM_SIZE, prompt_batch, tool_calling_tiny_model, write_tools_file  # noqa: E402

from rlvr.agent import AgentLoopManager  # noqa: E402
from rlvr.agent.chat import render_prompt_ids  # noqa: E402
from rlvr.agent.openai_endpoint.loop import OpenAIAgentLoop  # noqa: E402
from rlvr.trainer.config.schema import RolloutConfig  # noqa: E402
from rlvr.utils.testing import forward_log_probs  # noqa: E402
from rlvr.workers.rollout import HFRollout  # noqa: E402
from rlvr.workers.rollout.server import ServerRollout  # noqa: E402
from rlvr.workers.rollout.server.http import Endpoint, ReplicaRequestError, call_json  # noqa: E402

KEY = "test-key"
QUESTIONS = ["what is 3 + 1", "what is 5 + 1"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    model, tokenizer = tool_calling_tiny_model(questions=8, lr=5e-3, **VLLM_SIZE)
    tools = write_tools_file(tmp_path_factory.mktemp("tools") / "tools.yaml",
                             "rlvr.agent.tools.calculator.CalculatorTool")
    cfg = OmegaConf.structured(RolloutConfig)
    cfg.name, cfg.mode, cfg.response_length, cfg.prompt_length = "vllm", "async", 128, 64
    cfg.multi_turn.tool_config_path, cfg.multi_turn.max_assistant_turns = str(tools), 3
    cfg.agent.openai.run = "agent_helpers:calculator_agent"
    cfg.server.api_key, cfg.server.kv_cache_space_gb = KEY, 1
    cfg.server.log_dir = str(tmp_path_factory.mktemp("server_logs"))
    engine = ServerRollout(cfg, model, tokenizer, "cpu", seed=1, owns_module=True)
    try:
        yield model, tokenizer, cfg, engine
    finally:
        engine.close()


def prompts(tokenizer, questions=QUESTIONS, do_sample: bool = False, **meta):
    messages = [[{"role": "user", "content": q}] for q in questions]
    raw = np.empty(len(messages), dtype=object)
    raw[:] = messages
    return prompt_batch(tokenizer, [render_prompt_ids(tokenizer, m) for m in messages], {"raw_prompt": raw},
                        do_sample=do_sample, **meta)


def test_endpoint_trajectories_equal_tool_agent_on_the_server(setup):
    model, tokenizer, cfg, engine = setup
    cfg.agent.default_agent_loop = "tool_agent"
    reference = AgentLoopManager(cfg, tokenizer).generate_sequences(engine, prompts(tokenizer))
    loop = OpenAIAgentLoop(cfg, tokenizer)
    try:
        out = loop.generate_sequences(engine, prompts(tokenizer))
    finally:
        loop.close()
    assert reference.non_tensor_batch["num_tool_calls"].tolist() == [1, 1]
    for key in ("prompts", "responses", "response_mask", "attention_mask"):
        assert torch.equal(out.batch[key], reference.batch[key]), key
    torch.testing.assert_close(out.batch["rollout_log_probs"], reference.batch["rollout_log_probs"], rtol=0, atol=1e-4)
    sampled = out.batch["response_mask"].bool()
    assert (out.batch["response_versions"][sampled] == 0).all() and (out.batch["response_versions"][~sampled] == -1).all()


def test_greedy_generation_equals_the_hf_engine_with_fp32_log_probs(setup):
    model, tokenizer, cfg, engine = setup
    batch = prompts(tokenizer, QUESTIONS + ["what is 7 + 1"], eos_token_id=tokenizer.eos_token_id)
    out = engine.generate_sequences(batch)
    reference = HFRollout(cfg, model, tokenizer, "cpu", seed=0, owns_module=False).generate_sequences(batch)
    for key in ("responses", "response_mask", "input_ids", "position_ids"):
        assert torch.equal(out.batch[key], reference.batch[key]), key
    mask = out.batch["response_mask"].bool()
    with torch.no_grad():
        fp32 = forward_log_probs(model, out.batch, temperature=1.0)
    torch.testing.assert_close(out.batch["rollout_log_probs"][mask], fp32[mask], rtol=0, atol=1e-4)
    assert (out.batch["response_versions"][mask] == 0).all() and (out.batch["response_versions"][~mask] == -1).all()


def test_a_request_without_the_key_is_refused(setup):
    """Generation needs the key. The dev routes do not (vLLM's key guards /v1, /v2, /inference and
    /cohere only): that is why rlvr never binds a managed replica off loopback, key or not."""
    tokenizer, engine = setup[1], setup[3]
    url = engine.replicas[0].endpoint.url
    path, body = engine.backend.generate_request([1, 2, 3], {"max_tokens": 2, "temperature": 0.0, "top_p": 1.0,
                                                            "top_k": -1, "seed": 0, "stop": [], "stop_token_ids": []})
    with pytest.raises(ReplicaRequestError, match="HTTP 401"):
        call_json(Endpoint("replica 0", url), "POST", path, body, 60.0, "generate")
    assert call_json(Endpoint("replica 0", url, KEY), "POST", path, body, 60.0, "generate")["choices"]
    call_json(Endpoint("replica 0", url), "POST", "/reset_prefix_cache", None, 30.0, "reset_prefix_cache")


def _perturbed(model, scale: float):
    with torch.no_grad():
        for param in model.parameters():
            param.mul_(scale)


def test_reload_changes_generation_and_versions(setup):
    model, tokenizer, cfg, engine = setup
    batch = prompts(tokenizer, do_sample=True, temperature=1.0)
    before = engine.generate_sequences(batch)
    _perturbed(model, 1.3)
    stages = engine.update_weights(model.named_parameters(), 1)
    assert {"write", "pause", "reload", "reset_prefix_cache", "set_version", "resume", "sync"} <= set(stages)
    engine.set_rng_state({"generator": torch.Generator().manual_seed(123).get_state()})
    after = engine.generate_sequences(batch)
    mask = after.batch["response_mask"].bool()
    assert (after.batch["response_versions"][mask] == 1).all()
    with torch.no_grad():  # the new weights sampled them (the prefix cache of the old weights is gone)
        fp32 = forward_log_probs(model, after.batch, temperature=1.0)
        old = forward_log_probs(model, before.batch, temperature=1.0)
    torch.testing.assert_close(after.batch["rollout_log_probs"][mask], fp32[mask], rtol=0, atol=1e-4)
    before_mask = before.batch["response_mask"].bool()
    assert (old[before_mask] - before.batch["rollout_log_probs"][before_mask]).abs().max() > 1e-2


def test_killed_replica_is_restarted_and_serves_the_current_weights(setup):
    model, tokenizer, cfg, engine = setup
    replica = engine.replicas[0]
    os.killpg(replica.process.pid, signal.SIGKILL)
    replica.process.wait(timeout=30)
    out = engine.generate_sequences(prompts(tokenizer))  # waits for the restart (one replica: nowhere else to go)
    assert engine.counts["restarts"] == 1 and replica.starts == 2
    mask = out.batch["response_mask"].bool()
    assert (out.batch["response_versions"][mask] == 1).all()
    with torch.no_grad():
        fp32 = forward_log_probs(model, out.batch, temperature=1.0)
    torch.testing.assert_close(out.batch["rollout_log_probs"][mask], fp32[mask], rtol=0, atol=1e-4)
