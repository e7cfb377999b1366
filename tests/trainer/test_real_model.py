"""GRPO on the embedded SmolLM2-135M-Instruct (two-number addition from reasoning-gym, CPU, local
backend): the mean reward of the last steps is above that of the first steps."""

from __future__ import annotations

import numpy as np
import pytest

from rlvr.data_prep import reasoning_gym as rg_prep
from rlvr.trainer.config import load_config, validate_config
from rlvr.trainer.main_ppo import run_ppo

pytestmark = pytest.mark.slow

STEPS = 8


def test_grpo_raises_the_reward_on_the_real_model(tmp_path):
    train, _ = rg_prep.build("basic_arithmetic", tmp_path / "data", train_size=STEPS * 8, test_size=8, seed=0,
                             config=rg_prep.ADDITION)
    cfg = load_config("main_job", [
        f"data.train_files={train}", "data.val_files=null", "data.max_response_length=16",
        "actor_rollout_ref.actor.optim.lr=2e-5", f"trainer.total_training_steps={STEPS}", "trainer.max_time_s=null",
        "trainer.seed=1", f"trainer.default_local_dir={tmp_path / 'run'}", "trainer.export_hf=False",
        "trainer.progress_bar=False", "trainer.report=False", "trainer.logger=[jsonl]",
    ])
    validate_config(cfg)
    rewards = [row["critic/score/mean"] for row in run_ppo(cfg).metrics_history if "critic/score/mean" in row]
    assert len(rewards) == STEPS
    first, last = np.mean(rewards[:2]), np.mean(rewards[-2:])
    assert last > first + 0.05, f"mean reward did not go up: {rewards}"
