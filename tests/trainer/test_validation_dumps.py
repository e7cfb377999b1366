"""Validation with n samples per prompt (verl's val-core / val-aux metrics, pass@k), the generation
dumps of trainer.rollout_data_dir / validation_data_dir, log_val_generations to the loggers, and
trainer.val_only, on the local backend with the tiny model."""

from __future__ import annotations

import json

import pytest
from trainer_helpers import tiny_config

from rlvr.trainer.config import validate_config
from rlvr.trainer.main_ppo import run_ppo
from rlvr.trainer.tracking import read_metrics
from rlvr.utils.errors import ConfigError

VAL_PROMPTS, VAL_N, TRAIN_BATCH, TRAIN_N = 6, 3, 4, 4
BASE_FIELDS = {"input", "output", "gts", "score", "step"}
REWARD_EXTRAS = {"acc", "score"}  # the tiny reward function returns {"score", "acc"}


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def sampled_validation_run(tiny_model_dir, tiny_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("val_run")
    cfg = tiny_config(tiny_model_dir, tiny_data, root / "run", **{
        "trainer.total_training_steps": 2, "trainer.test_freq": 2, "trainer.report": False,
        "actor_rollout_ref.rollout.val_kwargs.n": VAL_N, "actor_rollout_ref.rollout.val_kwargs.do_sample": True,
        "actor_rollout_ref.rollout.val_kwargs.temperature": 1.0, "trainer.log_val_generations": 2,
        "trainer.rollout_data_dir": str(root / "rollouts"), "trainer.validation_data_dir": str(root / "val_dumps")})
    return root, run_ppo(cfg)


def test_validation_reports_verl_metrics_with_n_samples(sampled_validation_run):
    root, trainer = sampled_validation_run
    val_rows = [row for row in trainer.metrics_history if "val/acc" in row]
    assert [row["step"] for row in val_rows] == [0, 2]
    for row in val_rows:
        # the tiny reward returns acc: acc is the core variable, at N = val_kwargs.n = 3
        for name in ("mean@3", "best@3/mean", "pass@3", "best@2/mean", "pass@2"):
            assert (f"val-core/tiny/acc/{name}" in row) == (name.endswith("@3") or name.endswith("@3/mean")), name
        for name in ("std@3", "worst@3/mean", "best@2/mean", "best@2/std", "pass@2"):
            assert f"val-aux/tiny/acc/{name}" in row, name
        assert "val-aux/tiny/reward/mean@3" in row and "val-aux/tiny/score/mean@3" in row
        # mean@3 of acc over the prompts equals rlvr's val/acc (the same samples, every prompt has 3)
        assert row["val-core/tiny/acc/mean@3"] == pytest.approx(row["val/tiny/acc"])
        assert row["val-aux/tiny/reward/mean@3"] == pytest.approx(row["val/tiny/score"])
        assert row["val-core/tiny/acc/pass@3"] >= row["val-core/tiny/acc/best@3/mean"] - 1e-12
    steps = [row for row in trainer.metrics_history if "timing_s/step" in row]
    assert "timing_s/testing" in steps[-1] and "timing_per_token_ms/gen" in steps[-1]


def test_validation_samples_differ_with_do_sample(sampled_validation_run):
    root, _ = sampled_validation_run
    rows = _lines(root / "val_dumps" / "0.jsonl")
    by_input: dict[str, list[str]] = {}
    for row in rows:
        by_input.setdefault(row["input"], []).append(row["output"])
    assert len(by_input) == VAL_PROMPTS and all(len(outs) == VAL_N for outs in by_input.values())
    assert any(len(set(outs)) > 1 for outs in by_input.values())  # sampled at temperature 1, not greedy


def test_dumps_have_batch_times_n_rows_with_every_field(sampled_validation_run):
    root, _ = sampled_validation_run
    assert sorted(p.name for p in (root / "rollouts").iterdir()) == ["1.jsonl", "2.jsonl"]
    for step in (1, 2):
        rows = _lines(root / "rollouts" / f"{step}.jsonl")
        assert len(rows) == TRAIN_BATCH * TRAIN_N
        for row in rows:
            assert set(row) == BASE_FIELDS | REWARD_EXTRAS and row["step"] == step
            assert row["gts"] in "0123456789" and row["input"].count("say") == 1
            assert row["acc"] == float(row["score"] > 0.5)
    assert sorted(p.name for p in (root / "val_dumps").iterdir()) == ["0.jsonl", "2.jsonl"]
    for row in _lines(root / "val_dumps" / "2.jsonl"):
        assert set(row) == BASE_FIELDS | REWARD_EXTRAS | {"reward"} and row["step"] == 2
        assert row["reward"] == pytest.approx(row["score"])


def test_log_val_generations_reach_the_jsonl_and_console_loggers(sampled_validation_run, capsys):
    root, _ = sampled_validation_run
    logged = _lines(root / "run" / "val_generations.jsonl")
    assert [row["step"] for row in logged] == [0, 0, 2, 2]
    assert [row["input"] for row in logged[:2]] == [row["input"] for row in logged[2:]]  # the same prompts each time
    dumped = {(row["input"], row["output"]): row["score"] for row in _lines(root / "val_dumps" / "0.jsonl")}
    assert all(dumped[(row["input"], row["output"])] == row["score"] for row in logged[:2])


def test_val_only_validates_once_and_trains_nothing(tiny_model_dir, tiny_data, tmp_path, capsys):
    cfg = tiny_config(tiny_model_dir, tiny_data, tmp_path / "run", **{"trainer.val_only": True,
                                                                      "trainer.log_val_generations": 1})
    trainer = run_ppo(cfg)
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [row["step"] for row in rows] == [0] and "val-core/tiny/acc/mean@1" in rows[0]
    assert trainer.global_steps == 0 and not (tmp_path / "run" / "checkpoints").exists()
    assert "validation samples at step 0:" in capsys.readouterr().out


def test_val_only_without_validation_data_is_refused(tiny_model_dir, tiny_data, tmp_path):
    cfg = tiny_config(tiny_model_dir, tiny_data, tmp_path / "run", **{"trainer.val_only": True, "data.val_files": "null"})
    with pytest.raises(ConfigError, match="trainer.val_only.*data.val_files"):
        validate_config(cfg)
