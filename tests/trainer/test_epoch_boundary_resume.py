"""A run killed right after the checkpoint of an epoch's last step resumes and trains the remaining
epochs with the data order and the metrics of an uninterrupted run (verl 0.9.1 resumes such a run
into an exhausted data loader: it trains 0 steps and exits 0)."""

from __future__ import annotations

import pytest
from trainer_helpers import tiny_config, write_tiny_dataset

from rlvr.trainer.main_ppo import run_ppo
from rlvr.trainer.ppo.ray_trainer import RayPPOTrainer

PROMPTS, BATCH, EPOCHS = 8, 4, 2  # 2 steps per epoch, 4 steps in all


class Killed(BaseException):
    """The process died (not an Exception: nothing on the way may catch it)."""


def _config(tiny_model_dir, tiny_data, data, run_dir):
    return tiny_config(tiny_model_dir, {**tiny_data, "train": data}, run_dir, **{
        "trainer.total_training_steps": "null", "trainer.total_epochs": EPOCHS, "data.train_batch_size": BATCH,
        "trainer.save_freq": 1, "trainer.val_before_train": False, "data.val_files": "null",
        "trainer.report": False, "trainer.resume_mode": "auto", "actor_rollout_ref.rollout.n": 2})


def _trained_prompts(monkeypatch) -> list[list[str]]:
    """Record the prompts of every generated training batch (the data order)."""
    seen: list[list[str]] = []
    generate = RayPPOTrainer._generate

    def recording(self, batch, validate, do_sample=None):
        if not validate:
            seen.append(sorted({m[-1]["content"] for m in batch.non_tensor_batch["raw_prompt"]}))
        return generate(self, batch, validate, do_sample)

    monkeypatch.setattr(RayPPOTrainer, "_generate", recording)
    return seen


def test_a_run_killed_at_the_end_of_an_epoch_trains_the_remaining_epochs(tiny_model_dir, tiny_data, tmp_path,
                                                                         monkeypatch):
    data = write_tiny_dataset(tmp_path / "train.jsonl", PROMPTS)
    seen = _trained_prompts(monkeypatch)
    whole = run_ppo(_config(tiny_model_dir, tiny_data, data, tmp_path / "whole"))
    whole_order, seen[:] = list(seen), []
    assert whole.global_steps == EPOCHS * PROMPTS // BATCH

    save = RayPPOTrainer._save_checkpoint

    def save_then_die_at_the_epoch_end(self):
        save(self)
        if self.global_steps == PROMPTS // BATCH:  # the last step of epoch 1, its checkpoint whole on disk
            raise Killed

    monkeypatch.setattr(RayPPOTrainer, "_save_checkpoint", save_then_die_at_the_epoch_end)
    with pytest.raises(Killed):
        run_ppo(_config(tiny_model_dir, tiny_data, data, tmp_path / "run"))
    monkeypatch.setattr(RayPPOTrainer, "_save_checkpoint", save)
    resumed = run_ppo(_config(tiny_model_dir, tiny_data, data, tmp_path / "run"))

    assert resumed.global_steps == 4 and [row["step"] for row in resumed.metrics_history] == [3, 4]
    assert seen == whole_order  # epoch 1 (killed run) then epoch 2 (resumed run): the uninterrupted order
    assert sorted(p for batch in seen[2:] for p in batch) == sorted(p for batch in seen[:2] for p in batch)
    skip = ("timing", "perf/", "rollout/weights_version")  # the version counts pushes in this process
    assert [{k: v for k, v in row.items() if not k.startswith(skip)} for row in resumed.metrics_history] == \
           [{k: v for k, v in row.items() if not k.startswith(skip)} for row in whole.metrics_history[2:]]
