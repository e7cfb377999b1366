"""Training runs with the frozen scoring roles (tiny random models): a reward model alone with verl
0.9's keys and with the legacy ones, on the local and the Ray backend (its scores in the run's
batches equal a direct transformers forward of the input written out by hand); a reward model
beside a 0-weighted rule through the reward routing; on-policy distillation from a larger teacher."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from trainer_helpers import tiny_config
from transformers import AutoModelForSequenceClassification

from rlvr.trainer.main_ppo import run_ppo
from rlvr.trainer.ppo.ray_trainer import RayPPOTrainer
from rlvr.trainer.tracking import read_metrics
from rlvr.utils.testing import save_tiny_model, save_tiny_reward_model, tiny_tokenizer

STEPS = 1


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory) -> Path:
    return save_tiny_reward_model(tmp_path_factory.mktemp("rm") / "rm", seed=11)


@pytest.fixture
def scored_batches(monkeypatch) -> list:
    """Every batch the trainer scores (training and validation), after scoring."""
    batches = []
    score = RayPPOTrainer._score

    def recording(self, batch, reward_fn):
        metrics = score(self, batch, reward_fn)
        batches.append(batch)
        return metrics

    monkeypatch.setattr(RayPPOTrainer, "_score", recording)
    return batches


@torch.no_grad()
def check_rm_scores(batches: list, rm_dir: Path) -> int:
    """Each sample's ``rm_scores`` against a plain forward of its input built by hand (the tiny RM's
    template: ``### role: content`` lines then ``### end``, the policy's EOS text removed); returns
    the number of samples checked."""
    model = AutoModelForSequenceClassification.from_pretrained(rm_dir).eval()
    tokenizer = tiny_tokenizer()
    checked = 0
    for batch in batches:
        responses, mask = batch.batch["responses"], batch.batch["attention_mask"]
        valid = mask[:, -responses.shape[1]:].sum(-1)
        for row in range(len(batch)):
            answer = tokenizer.decode(responses[row, : valid[row]].tolist()).replace("<|im_end|>", "")
            question = batch.non_tensor_batch["raw_prompt"][row][-1]["content"]
            text = f"### user: {question}\n### assistant: {answer}\n### end"
            expected = model(input_ids=torch.tensor([tokenizer(text)["input_ids"]])).logits[0, 0]
            score = batch.batch["rm_scores"][row]
            assert abs(float(score[valid[row] - 1]) - float(expected)) < 1e-4
            assert float(score.abs().sum()) == pytest.approx(abs(float(score[valid[row] - 1])), abs=1e-7)
            checked += 1
    return checked


def _run(tiny_model_dir, tiny_data, tmp_path, **extra):
    cfg = tiny_config(tiny_model_dir, tiny_data, tmp_path / "run", **{"trainer.total_training_steps": STEPS, **extra})
    run_ppo(cfg)
    return read_metrics(tmp_path / "run" / "metrics.jsonl")


def test_reward_model_alone_with_verl_09_keys_local(tiny_model_dir, tiny_data, tmp_path, rm_dir, scored_batches):
    rows = _run(tiny_model_dir, tiny_data, tmp_path, **{"reward.reward_model.enable": True,
                                                        "custom_reward_function.path": "null",
                                                        "reward.reward_model.model_path": rm_dir,
                                                        "reward.reward_model.micro_batch_size_per_gpu": 5})
    assert check_rm_scores(scored_batches, rm_dir) == 2 * 6 + STEPS * 16  # two validations, STEPS training batches
    train = [row for row in rows if "timing_s/step" in row]
    for row, batch in zip(train, [b for b in scored_batches if len(b) == 16]):
        # the reward is the reward model's score alone (verl: no custom function, no routes)
        assert row["critic/score/mean"] == pytest.approx(float(batch.batch["rm_scores"].sum(-1).mean()), abs=1e-5)
        assert row["reward_model/tiny/mean_score"] == pytest.approx(row["critic/score/mean"], abs=1e-5)
        assert row["reward_model/input_length"] > 0


@pytest.mark.slow
@pytest.mark.ray
def test_reward_model_with_legacy_keys_on_its_own_ray_pool(tiny_model_dir, tiny_data, tmp_path, rm_dir, scored_batches):
    _run(tiny_model_dir, tiny_data, tmp_path, **{
        "trainer.backend": "ray", "reward_model.enable": True, "custom_reward_function.path": "null", "reward_model.model.path": rm_dir,
        "reward_model.enable_resource_pool": True, "reward_model.n_gpus_per_node": 2, "reward_model.nnodes": 1,
        "reward_model.micro_batch_size_per_gpu": 3, "reward_model.max_length": 128})
    assert check_rm_scores(scored_batches, rm_dir) == 2 * 6 + STEPS * 16


def test_reward_model_beside_a_zero_weighted_rule(tiny_model_dir, tiny_data, tmp_path, rm_dir, scored_batches):
    rows = _run(tiny_model_dir, tiny_data, tmp_path, **{
        "reward.reward_model.enable": True, "reward.reward_model.model_path": rm_dir,
        "reward.routes.tiny": "'reward_model+0*naive'"})
    check_rm_scores(scored_batches, rm_dir)
    train = [row for row in rows if "timing_s/step" in row]
    for row, batch in zip(train, [b for b in scored_batches if len(b) == 16]):
        assert row["reward/tiny/mean_score"] == pytest.approx(row["reward/tiny/reward_model/mean_score"], abs=1e-6)
        assert row["critic/score/mean"] == pytest.approx(float(batch.batch["rm_scores"].sum(-1).mean()), abs=1e-5)
        # the accuracy is the rule's verdict (its "acc"), not the reward model's score
        assert row["train/acc"] == pytest.approx(float(batch.non_tensor_batch["acc"].astype(float).mean()))
        assert "reward/tiny/naive/mean_score" in row and "reward/tiny/acc" in row
        assert row["train/acc"] == pytest.approx(row["reward/tiny/acc"], abs=1e-6)


def test_distillation_from_a_larger_teacher(tiny_model_dir, tiny_data, tmp_path):
    teacher = save_tiny_model(tmp_path / "teacher", hidden_size=48, num_hidden_layers=3, seed=4)
    rows = _run(tiny_model_dir, tiny_data, tmp_path, **{
        "distillation.enabled": True, "distillation.teacher_models.teacher_model.model_path": str(teacher),
        "distillation.distillation_loss.distillation_loss_coef": 0.5})
    train = [row for row in rows if "timing_s/step" in row]
    assert len(train) == STEPS
    for row in train:
        assert row["distillation/loss"] >= 0.0 and row["timing_s/teacher"] > 0
        assert row["distillation/teacher_log_prob"] < 0.0
