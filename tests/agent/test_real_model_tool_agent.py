"""The embedded SmolLM2-135M-Instruct in the tool-use main job for a few steps (CPU, local backend):
the untrained model calls the calculator, the tool results come back as inserted tokens, and GRPO
trains on the multi-turn batches (about 3 minutes on 2 idle cores)."""

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
        "trainer.total_training_steps=3", "trainer.max_time_s=null", "trainer.seed=1",
        f"trainer.default_local_dir={tmp_path / 'run'}", "trainer.export_hf=False", "trainer.progress_bar=False",
        "trainer.logger=[console,jsonl]",
    ])
    validate_config(cfg)
    trainer = run_ppo(cfg)
    steps = [row for row in trainer.metrics_history if "timing/step" in row]
    assert len(steps) == 3
    for row in steps:
        assert row["agent/tool_calls"] > 0.3, "the model hardly called the calculator"
        assert row["agent/num_turns/mean"] > 1.3 and row["agent/observation_tokens"] > 5
        assert row["agent/tool_timeouts"] == 0 and row["agent/stop/turn_limit"] < 0.5
        assert "actor/pg_loss" in row or row.get("train/skipped_step") == 1.0
    val = [row for row in trainer.metrics_history if "val/acc" in row]
    assert len(val) == 2 and val[0]["val/agent/tool_use_rate"] > 0.5
    assert val[0]["val/acc"] > 0.2  # the one-shot conversation already shows the model how to use the tool
    if "val/agent/correct_with_tool" in val[-1]:
        assert val[-1]["val/agent/correct_with_tool"] > 0.9  # three-digit products are not done in the head
    report = (tmp_path / "run" / "report.md").read_text()
    assert "[[<|im_end|>\n<|im_start|>tool\n" in html.unescape(report.replace("<br>", "\n"))
