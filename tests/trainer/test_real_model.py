"""The embedded SmolLM2-135M-Instruct on the main job's two-number addition from reasoning-gym (CPU,
local backend, seeded): GRPO raises the mean reward over 10 steps (about 4 minutes on 2 idle cores),
and two runs of one seed give identical metrics (about 2 minutes)."""

from __future__ import annotations

import numpy as np
import pytest

from rlvr.data_prep import reasoning_gym as rg_prep
from rlvr.trainer.config import load_config, validate_config
from rlvr.trainer.main_ppo import run_ppo

pytestmark = pytest.mark.slow

STEPS = 10


def test_grpo_raises_the_reward_on_the_real_model(tmp_path):
    train, _ = rg_prep.build("basic_arithmetic", tmp_path / "data", train_size=STEPS * 8, test_size=8, seed=0,
                             config=rg_prep.ADDITION, style=rg_prep.ADDITION_STYLE, operands=rg_prep.ADDITION_OPERANDS)
    cfg = load_config("main_job", [
        f"data.train_files={train}", "data.val_files=null",
        "actor_rollout_ref.actor.optim.lr=2e-5", "actor_rollout_ref.actor.optim.lr_scheduler_type=constant",
        "actor_rollout_ref.actor.optim.warmup_steps=0",
        f"trainer.total_training_steps={STEPS}", "trainer.max_time_s=null",
        "trainer.seed=1", f"trainer.default_local_dir={tmp_path / 'run'}", "trainer.export_hf=False",
        "trainer.progress_bar=False", "trainer.report=False", "trainer.logger=[console,jsonl]",
    ])
    validate_config(cfg)
    # the mean score of every generated sample (the main job trains only on groups whose scores differ)
    rewards = [row["train/unfiltered_score_mean"] for row in run_ppo(cfg).metrics_history]
    assert len(rewards) == STEPS
    first, last = np.mean(rewards[:3]), np.mean(rewards[-3:])
    assert last > first + 0.05, f"mean reward did not go up: {rewards}"


def test_one_seed_gives_identical_metrics_on_the_real_model(tmp_path):
    """The main job with its defaults (the shared-prompt forward on, two threads): two runs
    of one seed agree on every metric, bit for bit, for 2 steps. Before the cache rows were selected
    with ``index_select`` the runs drifted apart in the last bits from the second step on (2 steps, not 3:
    CI's time)."""
    train, _ = rg_prep.build("basic_arithmetic", tmp_path / "data", train_size=24, test_size=8, seed=0,
                             config=rg_prep.ADDITION, style=rg_prep.ADDITION_STYLE, operands=rg_prep.ADDITION_OPERANDS)
    runs = []
    for name in ("a", "b"):
        cfg = load_config("main_job", [
            f"data.train_files={train}", "data.val_files=null", "trainer.total_training_steps=2",
            "trainer.max_time_s=null", f"trainer.default_local_dir={tmp_path / name}", "trainer.export_hf=False",
            "trainer.progress_bar=False", "trainer.report=False", "trainer.logger=[console,jsonl]",
        ])
        assert cfg.actor_rollout_ref.actor.share_prompt_forward
        validate_config(cfg)
        runs.append([{k: v for k, v in row.items() if not k.startswith(("timing", "perf/")) and "memory" not in k}
                     for row in run_ppo(cfg).metrics_history])
    assert [row["step"] for row in runs[0]] == [1, 2]
    assert runs[0][0]["actor/grad_norm"] != runs[0][1]["actor/grad_norm"]
    assert runs[0] == runs[1]
