"""Multi-turn rollouts on the vLLM engine (tiny model, local backend): the env_agent loop drives vLLM
through the engine protocol (per-call response length, several rounds per step), and the trained
sequences are the sampled ones: the actor's recomputed log-probs of the sampled tokens agree with
vLLM's, which they could not if an id were re-tokenised or shifted between turns. The tool_agent
loop's stop string (``</tool_call>``) ends a turn of a model trained to call the calculator, and the
result is inserted, with the checks the HF engine passes. Needs vLLM (``make setup-vllm``;
``make test-vllm``)."""

from __future__ import annotations

import pytest
from agent_helpers import (VLLM_SIZE, agent_overrides, check_tool_calling_rollout, tool_calling_rollout,
                           tool_calling_rollout_config, tool_calling_tiny_model, write_tools_file)

from rlvr.trainer.config import load_config
from rlvr.trainer.main_ppo import run_ppo

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")


def test_env_agent_trains_with_the_vllm_engine(vllm_eos_prone_model_dir, gsm8k_like_data, tmp_path):
    cfg = load_config("grpo", agent_overrides(vllm_eos_prone_model_dir, gsm8k_like_data, tmp_path / "run", **{
        "actor_rollout_ref.rollout.name": "vllm", "actor_rollout_ref.rollout.kv_cache_memory_bytes": 64 << 20,
        "trainer.report": False}))
    trainer = run_ppo(cfg)
    steps = [row for row in trainer.metrics_history if "timing_s/step" in row]
    assert len(steps) == 2
    for row in steps:
        assert row["agent/num_turns/mean"] > 1.0, "the environment never got a second turn"
        assert row["agent/observation_tokens"] > 0  # feedback inserted between the sampled turns
        assert row["critic/score/mean"] < 0  # the wrong turns' -0.5 rewards reached the trained scores
        assert row["timing_s/update_weights"] > 0.0
        # the actor's log-probs of the sampled tokens of whole conversations equal vLLM's (fp32)
        assert 0.0 <= row["training/rollout_log_probs_diff_max"] < 1e-3


def test_tool_agent_on_the_vllm_engine_stops_at_the_call_and_inserts_the_result(tmp_path):
    from rlvr.workers.rollout import VLLMRollout

    model, tokenizer = tool_calling_tiny_model(questions=8, lr=5e-3, **VLLM_SIZE)
    tools = write_tools_file(tmp_path / "tools.yaml", "rlvr.agent.tools.calculator.CalculatorTool")
    cfg = tool_calling_rollout_config(tools)
    cfg.kv_cache_memory_bytes = 64 << 20
    engine = VLLMRollout(cfg, model, tokenizer, "cpu", seed=5, owns_module=True)
    engine.update_weights(model.named_parameters(), 0)
    out = tool_calling_rollout(engine, tokenizer, tools)
    check_tool_calling_rollout(model, tokenizer, out, atol=1e-3)
    assert out.meta_info["metrics"]["agent/tool_calls"] > 0.5
