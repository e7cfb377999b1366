"""Multi-turn rollouts in whole training runs of a tiny model (it ends a turn after a few tokens):
the env_agent loop on the local and the Ray backend, the tool_agent loop's metrics and the report's
transcripts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import ray
from agent_helpers import eos_prone_tiny_model, write_tools_file

from rlvr.single_controller import init_ray
from rlvr.trainer.config import load_config
from rlvr.trainer.main_ppo import run_ppo


@pytest.fixture(scope="module")
def eos_prone_model_dir(tmp_path_factory) -> Path:
    model, tokenizer = eos_prone_tiny_model()
    path = tmp_path_factory.mktemp("eos_prone") / "model"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def gsm8k_like_data(tmp_path_factory) -> dict[str, Path]:
    """Tiny questions scored by the strict GSM8K scorer ("#### <answer>"), which the retry environment uses too."""
    root = tmp_path_factory.mktemp("data")

    def write(name: str, size: int) -> Path:
        rows = [{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": f"what is {i} + 1"}],
                 "reward_model": {"ground_truth": str(i + 1)}, "extra_info": {"index": i}} for i in range(size)]
        path = root / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return path

    return {"train": write("train", 16), "val": write("val", 4)}


def overrides(model_dir: Path, data: dict[str, Path], run_dir: Path, **extra) -> list[str]:
    base = {
        "actor_rollout_ref.model.path": str(model_dir),
        "data.train_files": str(data["train"]), "data.val_files": str(data["val"]),
        "data.max_prompt_length": 32, "data.max_response_length": 48, "data.train_batch_size": 2,
        "actor_rollout_ref.rollout.n": 2, "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 4, "actor_rollout_ref.actor.optim.lr": 1e-3,
        "actor_rollout_ref.rollout.agent.default_agent_loop": "env_agent",
        "actor_rollout_ref.rollout.multi_turn.env_name": "retry",
        "actor_rollout_ref.rollout.multi_turn.env_kwargs": "{feedback: wrong, wrong_reward: -0.5}",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": 3,
        "actor_rollout_ref.rollout.val_kwargs.do_sample": True, "actor_rollout_ref.rollout.val_kwargs.temperature": 1.0,
        "reward_model.num_examine": 0, "trainer.backend": "local", "trainer.device": "cpu",
        "trainer.n_gpus_per_node": 1, "trainer.total_training_steps": 2, "trainer.val_before_train": True,
        "trainer.default_local_dir": str(run_dir), "trainer.progress_bar": False, "trainer.logger": "[console,jsonl]",
        "trainer.seed": 7, "trainer.export_hf": False, "trainer.call_timeout_s": 300,
    }
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


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
