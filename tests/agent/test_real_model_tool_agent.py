"""The embedded SmolLM2-135M-Instruct in the tool-use main job for a few steps (CPU, local backend):
the untrained model calls the calculator (SmolLM2's function-calling format, one worked conversation in
the prompt), the tool results come back as inserted tokens, and GRPO trains on the multi-turn batches
(a few minutes on 2 idle cores)."""

from __future__ import annotations

import html

import pytest

from rlvr.data_prep import tool_use
from rlvr.trainer.config import load_config, validate_config
from rlvr.trainer.main_ppo import run_ppo

pytestmark = pytest.mark.slow


def test_tool_agent_trains_the_real_model_with_the_calculator(tmp_path):
    train, test, tools = tool_use.build(tmp_path / "data", train_size=24, test_size=8, seed=0, fewshot=1)
    cfg = load_config("tool_job", [
        f"data.train_files={train}", f"data.val_files={test}",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tools}",
        # a quarter of the job's batch (2 questions x 4 samples) keeps the test to a few minutes on 2 cores
        "data.train_batch_size=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "trainer.total_training_steps=3", "trainer.max_time_s=null", "trainer.seed=1",
        f"trainer.default_local_dir={tmp_path / 'run'}", "trainer.export_hf=False", "trainer.progress_bar=False",
        "trainer.logger=[console,jsonl]",
    ])
    validate_config(cfg)
    trainer = run_ppo(cfg)
    steps = [row for row in trainer.metrics_history if "timing_s/step" in row]
    assert len(steps) == 3
    assert sum(row["agent/tool_calls"] for row in steps) / 3 > 0.1, "the model hardly called the calculator"
    assert max(row["agent/num_turns/mean"] for row in steps) > 1.0
    assert max(row["agent/observation_tokens"] for row in steps) > 0
    for row in steps:
        assert row["agent/tool_timeouts"] == 0 and row["agent/stop/turn_limit"] < 0.5
        assert "actor/pg_loss" in row or row.get("train/skipped_step") == 1.0
    val = [row for row in trainer.metrics_history if "val/acc" in row]
    assert len(val) == 2
    for row in val:  # three-digit products are not done in the head: every correct answer used the tool
        assert row["val/acc"] <= row["val/agent/tool_use_rate"]
        assert row.get("val/agent/correct_with_tool", 1.0) == 1.0
    report = (tmp_path / "run" / "report.md").read_text()
    assert "[[<|im_end|>\n<|im_start|>tool\n" in html.unescape(report.replace("<br>", "\n"))
