"""Fixtures of the trainer tests: a tiny random model on disk and a tiny synthetic dataset."""

from __future__ import annotations

from pathlib import Path

import pytest
from trainer_helpers import REWARD_FN, write_tiny_dataset

from rlvr.utils.testing import save_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny_model") / "model")


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny_data")
    reward = root / "reward.py"
    reward.write_text(REWARD_FN)
    return {"train": write_tiny_dataset(root / "train.jsonl", 32), "val": write_tiny_dataset(root / "val.jsonl", 6, 3),
            "reward": reward}
