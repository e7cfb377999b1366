"""The local backend trains without Ray installed (a lent GPU machine has none and it cannot be
carried there): a fresh process where ``import ray`` fails runs one step of a tiny run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainer_helpers import tiny_overrides

CHILD = """
import json, sys
sys.modules["ray"] = None  # `import ray` now raises ModuleNotFoundError, as where Ray is not installed
from rlvr.trainer.config import load_config
from rlvr.trainer.main_ppo import run_ppo
from rlvr.trainer.ppo.ray_trainer import RayPPOTrainer
from rlvr.utils.errors import ConfigError
trainer = run_ppo(load_config("grpo", json.loads(sys.argv[1])))
try:
    RayPPOTrainer(trainer.config, trainer.tokenizer, {}, None)  # no worker group class and no Ray to default to
except ConfigError as err:
    print("refused:", err)
print("steps:", trainer.global_steps)
"""


@pytest.mark.slow
def test_a_local_run_needs_no_ray(tiny_model_dir, tiny_data, tmp_path):
    overrides = tiny_overrides(tiny_model_dir, tiny_data, tmp_path / "run", **{
        "trainer.total_training_steps": 1, "trainer.val_before_train": False})
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(overrides)], cwd=repo, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "steps: 1" in done.stdout
    assert "refused: " in done.stdout and "Ray is not installed here" in done.stdout
