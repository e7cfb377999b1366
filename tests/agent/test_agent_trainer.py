"""Multi-turn rollouts in whole training runs of a tiny model (it ends a turn after a few tokens):
the env_agent loop on the local and the Ray backend, the tool_agent loop's metrics and the report's
transcripts."""

from __future__ import annotations

import pytest
import ray
from agent_helpers import agent_overrides as overrides
from agent_helpers import write_tools_file

from rlvr.single_controller import init_ray
from rlvr.trainer.config import load_config
from rlvr.trainer.main_ppo import run_ppo


def test_env_agent_trains_on_the_local_backend(eos_prone_model_dir, gsm8k_like_data, tmp_path):
    cfg = load_config("grpo", overrides(eos_prone_model_dir, gsm8k_like_data, tmp_path / "run", **{
        "actor_rollout_ref.rollout.val_kwargs.n": 4, "trainer.log_val_generations": 16}))
    trainer = run_ppo(cfg)
    steps = [row for row in trainer.metrics_history if "timing/step" in row]
    assert len(steps) == 2
    for row in steps:
        assert row["agent/num_turns/mean"] > 1.0, "the environment never got a second turn"
        assert "agent/stop/turn_limit" in row and "agent/env/correct" in row
        assert row["critic/score/mean"] < 0  # the wrong turns' -0.5 rewards reached the trained scores
        assert "train/agent/tool_use_rate" in row and row["train/agent/tool_use_rate"] == 0.0
    shown = [g["response"] for g in trainer.val_generations if "[[" in g["response"]]
    assert shown and all("<|im_start|>user\nwrong<|im_end|>" in text for text in shown)  # feedback, marked
    report = (tmp_path / "run" / "report.md").read_text()
    assert "[[" in report and "]]" in report


def test_tool_agent_run_reports_tool_metrics(eos_prone_model_dir, gsm8k_like_data, tmp_path):
    tools = write_tools_file(tmp_path / "tools.yaml", "rlvr.agent.tools.calculator.CalculatorTool")
    cfg = load_config("grpo", overrides(
        eos_prone_model_dir, gsm8k_like_data, tmp_path / "run", **{
            "actor_rollout_ref.rollout.agent.default_agent_loop": "tool_agent",
            "actor_rollout_ref.rollout.multi_turn.tool_config_path": str(tools),
            "trainer.total_training_steps": 1, "trainer.report": False}))
    trainer = run_ppo(cfg)
    step = [row for row in trainer.metrics_history if "timing/step" in row][0]
    assert step["agent/num_turns/mean"] == 1.0 and step["agent/stop/answered"] > 0  # no calls from a random model
    val = [row for row in trainer.metrics_history if "val/acc" in row]
    assert all("val/agent/tool_use_rate" in row for row in val)


@pytest.mark.ray
def test_env_agent_trains_on_the_ray_backend(eos_prone_model_dir, gsm8k_like_data, tmp_path):
    init_ray(num_cpus=2)
    try:
        cfg = load_config("grpo", overrides(
            eos_prone_model_dir, gsm8k_like_data, tmp_path / "run", **{
                "trainer.backend": "ray", "trainer.n_gpus_per_node": 2, "trainer.num_threads": 1,
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 2,
                "trainer.total_training_steps": 1, "trainer.report": False, "trainer.val_before_train": False}))
        trainer = run_ppo(cfg)
    finally:
        ray.shutdown()
    step = [row for row in trainer.metrics_history if "timing/step" in row][0]
    assert step["agent/num_turns/mean"] > 1.0 and step["critic/score/mean"] < 0
