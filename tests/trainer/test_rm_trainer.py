"""The RM trainer on a tiny random model: the Bradley-Terry loss against its formula, the first
step's reported loss against the scores of the untrained model, a learnable preference learned
(held-out pair accuracy up), and the exported model loading and scoring in the reward-model worker."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from trainer_helpers import tiny_config

from rlvr.data_prep.rm_pairs import pairs_of_group, sample_and_score, split_by_prompt
from rlvr.trainer.data import write_rows
from rlvr.trainer.rm_trainer import RewardModelTrainer, load_rm_config, main, split_overrides
from rlvr.trainer.config import load_config
from rlvr.trainer.ppo.metric_utils import reduce_metrics
from rlvr.utils.errors import DataError
from rlvr.workers.models import load_sequence_classifier
from rlvr.workers.rm_training import bradley_terry_loss


GOOD, BAD = ["right", "true", "yes", "correct"], ["wrong", "false", "no", "incorrect"]


def write_pairs(path: Path, count: int, offset: int = 0) -> Path:
    """Pairs whose chosen answer ends with a word of GOOD and the rejected one with a word of BAD
    (a learnable preference that a random model does not already hold)."""
    rows = [{"prompt": [{"role": "user", "content": f"what is {i} + {i + 1}?"}],
             "chosen": f"{2 * i + 1}, {GOOD[(i * 7) % 4]}", "rejected": f"{2 * i + 1}, {BAD[(i * 3 + 1) % 4]}",
             "data_source": "toy"} for i in range(offset, offset + count)]
    write_rows(rows, path)
    return path


def _trainer(model_dir: Path, tmp_path: Path, *rm: str) -> RewardModelTrainer:
    config = load_config(None, ["trainer.backend=local", "trainer.device=cpu", "trainer.num_threads=1",
                                f"trainer.default_local_dir={tmp_path / 'run'}", "trainer.logger=[jsonl]"])
    train, val = write_pairs(tmp_path / "train.jsonl", 48), write_pairs(tmp_path / "val.jsonl", 16, offset=100)
    return RewardModelTrainer(config, load_rm_config([f"model_path={model_dir}", f"train_files={train}",
                                                      f"val_files={val}", *rm]))


def test_bradley_terry_loss_is_its_formula():
    chosen, rejected = torch.tensor([1.0, -0.5, 2.0]), torch.tensor([0.0, 0.5, 3.0])
    expected = -sum(math.log(1 / (1 + math.exp(-(c - r)))) for c, r in zip(chosen.tolist(), rejected.tolist())) / 3
    assert abs(float(bradley_terry_loss(chosen, rejected)) - expected) < 1e-6


def test_first_step_reports_the_loss_of_the_untrained_model(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, "batch_size=8", "micro_batch_size=3")
    trainer._start()
    try:
        batch = trainer._batch(trainer.train, range(8))
        scores = trainer.group.score_pairs(batch)
        expected = float(bradley_terry_loss(scores.batch["chosen_scores"], scores.batch["rejected_scores"]))
        metrics = reduce_metrics(trainer.group.train_step(batch).meta_info["metrics"])
        assert abs(metrics["rm/loss"] - expected) < 1e-5
        margin = scores.batch["chosen_scores"] - scores.batch["rejected_scores"]
        assert metrics["rm/pair_accuracy"] == pytest.approx(float((margin > 0).float().mean()))
    finally:
        trainer.group.shutdown()


def test_a_learnable_preference_is_learned_and_the_model_exports(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, "batch_size=8", "micro_batch_size=8", "epochs=4", "optim.lr=3e-3",
                       "optim.warmup_steps_ratio=0.0", "optim.lr_scheduler_type=constant")
    summary = trainer.fit()
    assert summary["steps"] == 4 * 6 and summary["val_pair_accuracy_before"] < 0.9
    assert summary["val_pair_accuracy_after"] >= 0.9
    model = load_sequence_classifier(summary["model"])  # what reward.reward_model.model_path loads
    assert model.config.num_labels == 1
    saved = json.loads((tmp_path / "run" / "rm_summary.json").read_text())
    assert saved["val_pair_accuracy_after"] == summary["val_pair_accuracy_after"]
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any("rm/loss" in row for row in logged) and any("rm/val_pair_accuracy" in row for row in logged)


def test_command_line_splits_its_keys_and_refuses_bad_pairs(tmp_path, tiny_model_dir):
    assert split_overrides(["rm.epochs=2", "trainer.seed=3"]) == (["epochs=2"], ["trainer.seed=3"])
    bad = tmp_path / "bad.jsonl"
    write_rows([{"prompt": [{"role": "user", "content": "q"}], "chosen": "a"}], bad)
    with pytest.raises(DataError, match=r"row 0 lacks \['rejected'\]"):
        RewardModelTrainer(load_config(None, ["trainer.backend=local"]),
                           load_rm_config([f"train_files={bad}", f"model_path={tiny_model_dir}"]))
    assert main([f"rm.train_files={bad}", f"rm.model_path={tiny_model_dir}", "trainer.backend=local"]) == 2
    assert main(["rm.no_such_key=1"]) == 2


def test_pairs_of_a_group_pair_distinct_right_and_wrong_answers():
    texts = ["4", "5", "4", "6", "4", "7"]
    acc = [1.0, 0.0, 1.0, 0.0, 0.0, 1.0]  # row 2 repeats row 0's text; row 4 is a wrong "4" (another prompt's rule)
    assert pairs_of_group(list(range(6)), acc, texts) == [(0, 1), (5, 3)]
    assert pairs_of_group([0, 2], acc, texts) == []  # only right answers: no pair


def test_pairs_from_the_policys_own_samples(tiny_model_dir, tiny_data, tmp_path):
    cfg = tiny_config(tiny_model_dir, tiny_data, tmp_path / "run", **{"actor_rollout_ref.rollout.n": 6})
    rows, summary = sample_and_score(cfg, prompts=8, batch_size=4)
    assert summary["prompts"] == 8 and summary["samples"] == 48
    assert rows and all(row["chosen"] != row["rejected"] for row in rows)
    reward = {}
    exec(tiny_data["reward"].read_text(), reward)  # the run's scorer: chosen answers are right, rejected wrong
    for row in rows:
        assert reward["compute_score"]("tiny", row["chosen"], None)["acc"] == 1.0
        assert reward["compute_score"]("tiny", row["rejected"], None)["acc"] == 0.0
    train, test = split_by_prompt(rows, 0.25, seed=1)
    assert {r["prompt_index"] for r in train}.isdisjoint({r["prompt_index"] for r in test}) and len(train) + len(test) == len(rows)
