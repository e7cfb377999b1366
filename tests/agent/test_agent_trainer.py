"""Multi-turn rollouts in whole training runs of a tiny model (it ends a turn after a few tokens):
the env_agent loop on the local and the Ray backend, the tool_agent loop's metrics and the report's
transcripts."""

from __future__ import annotations

import pytest
import ray
import torch
from agent_helpers import agent_overrides as overrides
from agent_helpers import write_tools_file

from rlvr.protocol import DataProto
from rlvr.single_controller import init_ray
from rlvr.trainer.config import load_config
from rlvr.trainer.main_ppo import run_ppo
from rlvr.trainer.ppo.ray_trainer import RayPPOTrainer, ResourcePoolManager
from rlvr.trainer.ppo.utils import Role
from rlvr.utils.testing import tiny_tokenizer
from rlvr.workers.engine_workers import ActorRolloutRefWorker


def test_env_agent_trains_on_the_local_backend(eos_prone_model_dir, gsm8k_like_data, tmp_path):
    cfg = load_config("grpo", overrides(eos_prone_model_dir, gsm8k_like_data, tmp_path / "run", **{
        "actor_rollout_ref.rollout.val_kwargs.n": 4, "trainer.log_val_generations": 16}))
    trainer = run_ppo(cfg)
    steps = [row for row in trainer.metrics_history if "timing_s/step" in row]
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
    step = [row for row in trainer.metrics_history if "timing_s/step" in row][0]
    assert step["agent/num_turns/mean"] == 1.0 and step["agent/stop/answered"] > 0  # no calls from a random model
    val = [row for row in trainer.metrics_history if "val/acc" in row]
    assert all("val/agent/tool_use_rate" in row for row in val)


def test_tool_and_environment_rewards_do_not_change_accuracy(eos_prone_model_dir, gsm8k_like_data, tmp_path):
    cfg = load_config("grpo", overrides(eos_prone_model_dir, gsm8k_like_data, tmp_path / "run", **{
        "actor_rollout_ref.actor.use_kl_loss": False}))
    pools = ResourcePoolManager({"global_pool": [1]}, {Role.ActorRollout: "global_pool"}, use_gpu=False,
                                backend="local")
    task_scores = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])

    def scorer_without_acc(data, return_dict=True):  # a scorer that reports a score and no "acc"
        return {"reward_tensor": task_scores.clone()}

    trainer = RayPPOTrainer(cfg, tiny_tokenizer(), {Role.ActorRollout: ActorRolloutRefWorker}, pools,
                            reward_fn=scorer_without_acc, val_reward_fn=scorer_without_acc)

    # sample 0: wrong answer, but tool step rewards worth 1.5; sample 1: right; sample 2: wrong, no rewards
    turn_scores = torch.tensor([[1.0, 0.5, 0.0], [0.0, -0.5, 0.0], [0.0, 0.0, 0.0]])
    batch = DataProto.from_dict(tensors={"responses": torch.zeros(3, 3, dtype=torch.long), "turn_scores": turn_scores})
    trainer._score(batch, scorer_without_acc)
    assert batch.non_tensor_batch["acc"].tolist() == [0.0, 1.0, 0.0]  # the scorer's verdict, not score + rewards
    assert batch.batch["token_level_scores"].sum(-1).tolist() == [1.5, 0.5, 0.0]  # the rewards are still trained on


@pytest.mark.ray
@pytest.mark.slow  # a Ray run (the local-backend runs of the loops are in the default suite)
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
    step = [row for row in trainer.metrics_history if "timing_s/step" in row][0]
    assert step["agent/num_turns/mean"] > 1.0 and step["critic/score/mean"] < 0


@pytest.mark.ray
@pytest.mark.slow  # a Ray run
def test_tool_agent_calls_the_calculator_on_the_ray_backend(tool_calling_model_dir, gsm8k_like_data, tmp_path,
                                                            monkeypatch):
    write_tools_file(tmp_path / "tools.yaml", "rlvr.agent.tools.calculator.CalculatorTool")
    monkeypatch.chdir(tmp_path)
    cfg = load_config("grpo", overrides(tool_calling_model_dir, gsm8k_like_data, tmp_path / "run", **{
        "trainer.backend": "ray", "trainer.n_gpus_per_node": 2, "trainer.num_threads": 1,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 2, "data.max_response_length": 128,
        "actor_rollout_ref.rollout.agent.default_agent_loop": "tool_agent",
        "actor_rollout_ref.rollout.multi_turn.tool_config_path": "tools.yaml",  # relative to the start directory
        "trainer.total_training_steps": 1, "trainer.report": False, "trainer.val_before_train": False}))
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # the driver and its workers run in another directory
    init_ray(num_cpus=2)
    try:
        trainer = run_ppo(cfg)
    finally:
        ray.shutdown()
    step = [row for row in trainer.metrics_history if "timing_s/step" in row][0]
    assert step["agent/tool_calls"] > 0 and step["train/agent/tool_use_rate"] > 0
    assert step["agent/tool_errors"] < step["agent/tool_calls"]  # calculator answers came back
    assert step["agent/num_turns/mean"] > 1.0 and step["agent/observation_tokens"] > 0
    assert step["agent/tool_timeouts"] == 0.0 and "actor/pg_loss" in step
