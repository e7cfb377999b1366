"""Checkpoint directories: manifest written last, whole-or-skipped on resume, keep the last k; a run
resumes past a truncated checkpoint."""

from __future__ import annotations

import hashlib
import json
import logging

import pytest
from trainer_helpers import tiny_config

from rlvr.trainer.checkpoint import (
    LATEST_FILE,
    MANIFEST_FILE,
    TRAINER_STATE_FILE,
    CheckpointError,
    CheckpointManager,
    RunCheckpoints,
    checkpoint_problem,
)
from rlvr.trainer import checkpoint as checkpoint_module
from rlvr.trainer.main_ppo import run_ppo


def _save(manager: CheckpointManager, step: int) -> None:
    tmp = manager.begin(step)
    (tmp / "actor").mkdir()
    (tmp / "actor" / "model.pt").write_text(f"weights {step}" * 100)
    manager.commit(tmp, step, {"global_steps": step})


def test_commit_renames_and_writes_the_manifest_last(tmp_path):
    manager = CheckpointManager(tmp_path / "ckpt")
    assert manager.latest() is None and manager.steps() == []
    _save(manager, 2)
    final = tmp_path / "ckpt" / "global_step_2"
    assert (final / "actor" / "model.pt").read_text() == "weights 2" * 100
    assert not (tmp_path / "ckpt" / "global_step_2.tmp").exists()
    assert (tmp_path / "ckpt" / LATEST_FILE).read_text() == "2"
    assert manager.latest() == final
    assert CheckpointManager.load_trainer_state(final) == {"global_steps": 2}
    manifest = json.loads((final / MANIFEST_FILE).read_text())
    assert manifest["step"] == 2 and sorted(manifest["files"]) == ["actor/model.pt", TRAINER_STATE_FILE]
    for name, entry in manifest["files"].items():  # sizes and digests that sha256sum would print
        data = (final / name).read_bytes()
        assert entry == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert sorted(p.name for p in final.iterdir()) == ["actor", MANIFEST_FILE, TRAINER_STATE_FILE]


def test_an_unfinished_checkpoint_is_skipped(tmp_path, caplog):
    manager = CheckpointManager(tmp_path)
    _save(manager, 1)
    tmp = manager.begin(2)  # crash while saving step 2: no manifest, no rename
    (tmp / "actor").mkdir()
    (tmp_path / "global_step_3").mkdir()  # a folder without a manifest is not a checkpoint either
    (tmp_path / "global_step_3" / TRAINER_STATE_FILE).write_text("x")
    assert manager.steps() == [1]
    with caplog.at_level(logging.WARNING):
        assert manager.latest() == tmp_path / "global_step_1"
    assert f"global_step_3 skipped: no {MANIFEST_FILE} (the save did not finish)" in caplog.text
    assert "global_step_2.tmp skipped: a save that did not finish" in caplog.text
    _save(manager, 2)  # saving again replaces the leftover temp dir
    assert manager.steps() == [1, 2]


@pytest.mark.parametrize(("damage", "problem"), [
    (lambda f: f.write_bytes(f.read_bytes()[:10]), "actor/model.pt has 10 bytes, the manifest says 900"),
    (lambda f: f.write_bytes(f.read_bytes()[:-1] + b"#"), "actor/model.pt does not match its SHA-256"),
    (lambda f: f.unlink(), "actor/model.pt is missing"),
])
def test_a_damaged_checkpoint_is_skipped_for_the_previous_one(tmp_path, caplog, damage, problem):
    manager = CheckpointManager(tmp_path)
    _save(manager, 1)
    _save(manager, 2)
    damage(tmp_path / "global_step_2" / "actor" / "model.pt")
    assert problem in checkpoint_problem(tmp_path / "global_step_2")
    with caplog.at_level(logging.WARNING):
        assert manager.latest() == tmp_path / "global_step_1"
    assert f"global_step_2 skipped: {problem}" in caplog.text
    assert "falling back to the previous one" in caplog.text
    with pytest.raises(CheckpointError, match=f"global_step_2 is not a whole rlvr checkpoint: {problem}"):
        CheckpointManager.verify(tmp_path / "global_step_2")
    assert CheckpointManager.verify(tmp_path / "global_step_1") == tmp_path / "global_step_1"


def test_an_unreadable_manifest_is_reported(tmp_path):
    manager = CheckpointManager(tmp_path)
    _save(manager, 1)
    (tmp_path / "global_step_1" / MANIFEST_FILE).write_text("{not json")
    assert checkpoint_problem(tmp_path / "global_step_1").startswith(f"{MANIFEST_FILE} is unreadable")
    assert manager.latest() is None


def test_latest_at_most(tmp_path):
    manager = CheckpointManager(tmp_path)
    for step in (1, 2, 3):
        _save(manager, step)
    assert manager.latest(at_most=2) == tmp_path / "global_step_2"
    assert manager.latest(at_most=0) is None


def test_keep_last_k(tmp_path):
    manager = CheckpointManager(tmp_path, max_to_keep=2)
    for step in (1, 2, 3, 4):
        _save(manager, step)
    assert manager.steps() == [3, 4]
    assert not (tmp_path / "global_step_1").exists()


def test_keep_last_k_never_deletes_the_newest_whole_checkpoint(tmp_path):
    manager = CheckpointManager(tmp_path, max_to_keep=1)
    _save(manager, 1)
    tmp = manager.begin(2)  # a save that failed half-way is not counted
    (tmp / "actor").mkdir()
    CheckpointManager(tmp_path, max_to_keep=1)._prune()
    assert manager.steps() == [1]
    manager.max_to_keep = None
    _save(manager, 2)
    _save(manager, 3)
    (tmp_path / "global_step_3" / "actor" / "model.pt").write_text("cut")  # damaged after it was written
    manager.max_to_keep = 1
    manager._prune()
    assert manager.steps() == [2, 3]  # step 2 is the newest whole one: kept; step 1 is older: removed
    assert manager.latest() == tmp_path / "global_step_2"


def test_the_next_save_removes_what_an_interrupted_save_left(tmp_path, caplog):
    manager = CheckpointManager(tmp_path)
    _save(manager, 1)
    tmp = manager.begin(2)  # the process died while the workers wrote step 2
    (tmp / "actor").mkdir()
    (tmp / "actor" / "model.pt").write_text("half of the weights")
    (tmp_path / "global_step_1.old").mkdir()  # and a folder renamed aside by an earlier commit
    stray = tmp_path / f".{LATEST_FILE}.tmp-k1ll3d"  # and a kill while the latest step was written
    stray.write_text("")
    unrelated = tmp_path / "notes.tmp-1"
    unrelated.write_text("the user's")
    with caplog.at_level(logging.WARNING):
        _save(manager, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_1", "global_step_3", LATEST_FILE, unrelated.name]
    assert "global_step_2.tmp: removed what an interrupted save left" in caplog.text
    assert "global_step_1.old: removed what an interrupted save left" in caplog.text
    assert f"{stray.name}: removed what an interrupted save left" in caplog.text


def test_a_crash_while_replacing_a_step_keeps_that_step(tmp_path, monkeypatch, caplog):
    """Step 2 is saved again (a restart redid it); the process dies after the old folder was moved
    aside and before the new one was renamed in: an automatic resume still finds step 2, the new
    save's, and clears the old copy."""
    manager = CheckpointManager(tmp_path)
    _save(manager, 2)
    replace = checkpoint_module.os.replace

    def die_on_the_rename_in(src, dst):
        if str(src).endswith("global_step_2.tmp"):
            raise KeyboardInterrupt("killed")
        replace(src, dst)

    monkeypatch.setattr(checkpoint_module.os, "replace", die_on_the_rename_in)
    tmp = manager.begin(2)
    (tmp / "actor").mkdir()
    (tmp / "actor" / "model.pt").write_text("weights of the redone step 2")
    with pytest.raises(KeyboardInterrupt):
        manager.commit(tmp, 2, {"global_steps": 2, "redone": True})
    monkeypatch.setattr(checkpoint_module.os, "replace", replace)
    with caplog.at_level(logging.WARNING):
        resumed = RunCheckpoints(tmp_path).to_resume("auto", None)
    assert resumed == tmp_path / "global_step_2" and checkpoint_problem(resumed) is None
    assert CheckpointManager.load_trainer_state(resumed) == {"global_steps": 2, "redone": True}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_2", LATEST_FILE]
    assert "global_step_2.tmp: the save was whole but not renamed; renamed to global_step_2" in caplog.text


def test_loading_a_non_checkpoint_says_what_to_do(tmp_path):
    with pytest.raises(CheckpointError, match=f"no {TRAINER_STATE_FILE}.*global_step_<k>"):
        CheckpointManager.load_trainer_state(tmp_path)
    with pytest.raises(CheckpointError, match=f"no {MANIFEST_FILE}"):
        CheckpointManager.verify(tmp_path)


def test_a_run_resumes_past_a_truncated_checkpoint(tiny_model_dir, tiny_data, tmp_path, caplog):
    """The newest checkpoint's weights are cut short on disk: resume_mode=auto warns, takes the
    previous checkpoint and the run reaches the metrics of an uninterrupted run."""
    extra = {"trainer.save_freq": 1, "trainer.report": False, "trainer.val_before_train": False,
             "trainer.resume_mode": "auto"}
    run_ppo(tiny_config(tiny_model_dir, tiny_data, tmp_path / "run", **extra, **{"trainer.total_training_steps": 2}))
    weights = tmp_path / "run" / "checkpoints" / "global_step_2" / "actor" / "model.pt"
    size = weights.stat().st_size
    weights.write_bytes(weights.read_bytes()[: size // 2])
    with caplog.at_level(logging.WARNING):
        resumed = run_ppo(tiny_config(tiny_model_dir, tiny_data, tmp_path / "run", **extra))
    assert (f"global_step_2 skipped: actor/model.pt has {size // 2} bytes, the manifest says {size} "
            "(truncated or rewritten); falling back to the previous one") in caplog.text
    whole = run_ppo(tiny_config(tiny_model_dir, tiny_data, tmp_path / "whole", **extra))
    assert [row["step"] for row in resumed.metrics_history] == [2, 3, 3]
    skip = ("timing", "perf/", "rollout/weights_version")  # the version counts pushes in this process
    assert [{k: v for k, v in r.items() if not k.startswith(skip)} for r in resumed.metrics_history] == \
           [{k: v for k, v in r.items() if not k.startswith(skip)} for r in whole.metrics_history[1:]]
