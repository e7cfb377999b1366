"""verl 0.9.1's generated configs as the keys test sees them (keys and defaults from
``verl_0_9_1_keys.json``, written by ``scripts/verl_key_table.py extract``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from rlvr.trainer.config.verl_pending import pending_rule
from rlvr.trainer.config.verl_translate import unflatten

KEYS_FILE = Path(__file__).parent / "verl_0_9_1_keys.json"
NAMES = ("ppo_trainer", "ppo_megatron_trainer")
LOCAL = {
    "actor_rollout_ref.rollout.name": "hf",  # verl leaves it to the user (???); rlvr's in-process HF engine
    "actor_rollout_ref.rollout.mode": "sync",  # verl's async is vLLM servers (not in this venv)
    "actor_rollout_ref.rollout.tensor_model_parallel_size": 1,  # verl's 2 is vLLM's; an HF engine is whole per worker
    "trainer.logger": ["console"],  # verl's wandb needs the wandb package
}
"""Values of the generated configs that need files, packages or a user's choice; the data and
model paths point at the tiny fixtures."""


def generated(name: str) -> dict[str, Any]:
    """Dotted key -> verl's default, of ``ppo_trainer`` or ``ppo_megatron_trainer``."""
    return json.loads(KEYS_FILE.read_text())[name]


def write_user_config(name: str, folder: Path, model: Path, data: Path) -> Path:
    """``folder/verl_<name>.yaml``: verl's generated config without the pending keys, local paths,
    building on rlvr's ``ppo_trainer`` as a user's YAML would."""
    leaves = {key: value for key, value in generated(name).items() if pending_rule(key) is None}
    leaves.update(LOCAL)
    for key in ("actor_rollout_ref.model.path", "critic.model.path"):
        leaves[key] = str(model)
    leaves["data.train_files"] = leaves["data.val_files"] = str(data)
    config = {"defaults": ["ppo_trainer", "_self_"], **unflatten(leaves)}
    path = folder / f"verl_{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path
