"""Checkpoint directories: atomic commit, latest complete one, keep the last k."""

from __future__ import annotations

import pytest

from rlvr.trainer.checkpoint import LATEST_FILE, TRAINER_STATE_FILE, CheckpointManager


def _save(manager: CheckpointManager, step: int) -> None:
    tmp = manager.begin(step)
    (tmp / "actor").mkdir()
    (tmp / "actor" / "model.pt").write_text(f"weights {step}")
    manager.commit(tmp, step, {"global_steps": step})


def test_commit_renames_and_records_latest(tmp_path):
    manager = CheckpointManager(tmp_path / "ckpt")
    assert manager.latest() is None and manager.steps() == []
    _save(manager, 2)
    final = tmp_path / "ckpt" / "global_step_2"
    assert (final / "actor" / "model.pt").read_text() == "weights 2"
    assert not (tmp_path / "ckpt" / "global_step_2.tmp").exists()
    assert (tmp_path / "ckpt" / LATEST_FILE).read_text() == "2"
    assert manager.latest() == final
    assert CheckpointManager.load_trainer_state(final) == {"global_steps": 2}


def test_an_unfinished_checkpoint_is_ignored(tmp_path):
    manager = CheckpointManager(tmp_path)
    _save(manager, 1)
    tmp = manager.begin(2)  # crash while saving step 2: no rename
    (tmp / "actor").mkdir()
    (tmp_path / "global_step_3").mkdir()  # a directory without trainer state is not complete either
    assert manager.steps() == [1]
    assert manager.latest() == tmp_path / "global_step_1"
    _save(manager, 2)  # saving again replaces the leftover temp dir
    assert manager.steps() == [1, 2]


def test_keep_last_k(tmp_path):
    manager = CheckpointManager(tmp_path, max_to_keep=2)
    for step in (1, 2, 3, 4):
        _save(manager, step)
    assert manager.steps() == [3, 4]
    assert not (tmp_path / "global_step_1").exists()


def test_loading_a_non_checkpoint_says_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"no {TRAINER_STATE_FILE}.*global_step_<k>"):
        CheckpointManager.load_trainer_state(tmp_path)
