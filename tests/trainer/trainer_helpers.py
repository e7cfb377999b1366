"""Helpers of the trainer tests: a tiny synthetic dataset, a custom reward function, config builders."""

from __future__ import annotations

import json
from pathlib import Path

from rlvr.trainer.config import load_config

REWARD_FN = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """Share of the response's characters with an even code point: varies from sample to sample
    of a random model, so group-relative advantages are not all zero."""
    if not solution_str:
        return {"score": 0.0, "acc": 0.0}
    share = sum(ord(c) % 2 == 0 for c in solution_str) / len(solution_str)
    return {"score": share, "acc": float(share > 0.5)}
'''


def write_tiny_dataset(path: Path, size: int, seed: int = 0) -> Path:
    """``size`` prompts "repeat the digit d" in the common RL format, ``data_source`` "tiny"."""
    rows = []
    for i in range(size):
        digit = str((i * 7 + seed) % 10)
        rows.append({"data_source": "tiny", "prompt": [{"role": "user", "content": f"say {digit} {i}"}],
                     "ability": "toy", "reward_model": {"style": "rule", "ground_truth": digit},
                     "extra_info": {"index": i}})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def tiny_overrides(model_dir: Path, data: dict[str, Path], run_dir: Path, **extra) -> list[str]:
    """Overrides for a fast CPU run of the tiny model on the tiny data (``extra``: key=value)."""
    base = {
        "actor_rollout_ref.model.path": str(model_dir),
        "data.train_files": str(data["train"]), "data.val_files": str(data["val"]),
        "data.max_prompt_length": 32, "data.max_response_length": 8, "data.train_batch_size": 4,
        "actor_rollout_ref.rollout.n": 4, "actor_rollout_ref.rollout.temperature": 1.0,
        "actor_rollout_ref.actor.ppo_mini_batch_size": 4, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 8,
        "actor_rollout_ref.actor.optim.lr": 1e-3, "critic.ppo_mini_batch_size": 4,
        "critic.ppo_micro_batch_size_per_gpu": 8, "critic.optim.lr": 1e-3,
        "custom_reward_function.path": str(data["reward"]), "reward_model.num_examine": 0,
        "trainer.backend": "local", "trainer.device": "cpu", "trainer.n_gpus_per_node": 1,
        "trainer.total_training_steps": 3, "trainer.test_freq": -1, "trainer.save_freq": -1,
        "trainer.val_before_train": True, "trainer.default_local_dir": str(run_dir),
        "trainer.progress_bar": False, "trainer.logger": "[console,jsonl]", "trainer.seed": 7,
        "trainer.export_hf": False, "trainer.call_timeout_s": 300,
    }
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


def tiny_config(model_dir: Path, data: dict[str, Path], run_dir: Path, preset: str = "grpo", **extra):
    return load_config(preset, tiny_overrides(model_dir, data, run_dir, **extra))
