"""The distillation teacher worker (a larger model with the student's tokenizer) against a plain
forward of the same model, the tokenizer check, and the actor's distillation loss on the teacher's
scores against the reference formula."""

from __future__ import annotations

import pytest
import torch
from model_worker_utils import local_group
from rm_batches import chat_rollout_batch
from transformers import AutoModelForCausalLM

from rlvr.protocol import DataProto
from rlvr.trainer.config import load_config
from rlvr.utils.errors import WorkerError
from rlvr.utils.testing import forward_log_probs, save_tiny_model, tiny_tokenizer
from rlvr.workers.engine_workers import ActorRolloutRefWorker
from rlvr.workers.teacher import TeacherWorker

TEACHER = "distillation.teacher_models.teacher_model"


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory) -> str:
    """A bigger model than the student (48 wide, 3 layers, a vocabulary padded past the tokenizer's)."""
    return str(save_tiny_model(tmp_path_factory.mktemp("teacher") / "t", hidden_size=48, num_hidden_layers=3,
                               vocab_size=300, seed=5))


def distill_config(student: str, teacher: str, *overrides: str):
    return load_config(None, [f"actor_rollout_ref.model.path={student}", "trainer.backend=local", "trainer.num_threads=1",
                              "distillation.enabled=true", f"{TEACHER}.model_path={teacher}",
                              f"{TEACHER}.log_prob_micro_batch_size_per_gpu=3", *overrides])


@torch.no_grad()
def full_log_softmax(model_dir: str, batch: DataProto) -> torch.Tensor:
    """``[B, R, V]`` untempered next-token log-probs at the response positions, from one plain forward."""
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    logits = model(input_ids=batch.batch["input_ids"], attention_mask=batch.batch["attention_mask"],
                   position_ids=batch.batch["position_ids"]).logits.float()
    response_len = batch.batch["responses"].shape[1]
    return logits[:, -response_len - 1:-1].log_softmax(-1)


def test_teacher_log_probs_equal_a_plain_forward(model_dir, teacher_dir):
    group = local_group(TeacherWorker, distill_config(model_dir, teacher_dir))
    batch = chat_rollout_batch()
    batch.meta_info["temperature"] = 0.7  # the student's; the teacher's log-probs are untempered
    out = group.compute_teacher_log_prob(batch).batch["teacher_log_probs"]
    model = AutoModelForCausalLM.from_pretrained(teacher_dir).eval()
    expected = forward_log_probs(model, batch.batch, 1.0)
    mask = batch.batch["response_mask"].bool()
    assert (out - expected)[mask].abs().max() < 1e-5


def test_teacher_topk_equals_the_top_of_a_plain_forward_within_the_students_vocabulary(model_dir, teacher_dir):
    config = distill_config(model_dir, teacher_dir, "distillation.distillation_loss.loss_mode=forward_kl_topk",
                            "distillation.distillation_loss.topk=5")
    out = local_group(TeacherWorker, config).compute_teacher_log_prob(chat_rollout_batch())
    log_softmax = full_log_softmax(teacher_dir, chat_rollout_batch())
    student_vocab = len(tiny_tokenizer())
    expected, expected_ids = log_softmax[..., :student_vocab].topk(5, dim=-1)  # normalised over all 300 ids
    mask = chat_rollout_batch().batch["response_mask"].bool()
    assert (out.batch["teacher_topk_log_probs"] - expected)[mask].abs().max() < 1e-5
    assert torch.equal(out.batch["teacher_topk_ids"][mask], expected_ids[mask])
    assert int(out.batch["teacher_topk_ids"].max()) < student_vocab


def test_a_teacher_with_another_tokenizer_is_refused(model_dir, tmp_path):
    other = save_tiny_model(tmp_path / "other")
    tokenizer = tiny_tokenizer()
    tokenizer.add_tokens(["<extra_token>"])
    tokenizer.save_pretrained(other)
    with pytest.raises(WorkerError, match=r"teacher .* tokenizes differently from the student .* \(261 vs 260 tokens.*"
                                          r"same tokenizer, any size"):
        local_group(TeacherWorker, distill_config(model_dir, str(other)))


@pytest.mark.parametrize("use_task_rewards", [False, True])
def test_actor_update_reports_the_k3_loss_of_its_own_log_probs(model_dir, teacher_dir, use_task_rewards):
    config = distill_config(model_dir, teacher_dir, f"distillation.distillation_loss.use_task_rewards={use_task_rewards}",
                            "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.rollout.n=1",
                            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "data.train_batch_size=4",
                            "actor_rollout_ref.actor.optim.lr=0.01")
    batch = chat_rollout_batch()
    batch.batch["teacher_log_probs"] = local_group(TeacherWorker, config).compute_teacher_log_prob(
        batch).batch["teacher_log_probs"]
    student = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    before = forward_log_probs(student, batch.batch, 1.0)
    mask = batch.batch["response_mask"]
    batch.batch["old_log_probs"] = before
    batch.batch["advantages"] = torch.zeros_like(before)
    actor = local_group(ActorRolloutRefWorker, config, "actor")
    metrics = actor.update_actor(batch).meta_info["metrics"]
    assert abs(metrics["distillation/loss"][0] - k3_mean(batch.batch["teacher_log_probs"], before, mask)) < 1e-5
    assert metrics["distillation/abs_loss"][0] == pytest.approx(metrics["distillation/loss"][0], abs=1e-6)
    assert metrics["actor/pg_loss"][0] == pytest.approx(0.0, abs=1e-7)  # zero advantages
    after = actor.compute_log_prob(batch).batch["old_log_probs"]  # the step moved the student to the teacher
    assert k3_mean(batch.batch["teacher_log_probs"], after, mask) < k3_mean(batch.batch["teacher_log_probs"], before, mask)


def k3_mean(teacher: torch.Tensor, student: torch.Tensor, mask: torch.Tensor) -> float:
    delta = (teacher - student).clamp(-20, 20)
    return float(((delta.exp() - delta - 1).clamp(-10, 10) * mask).sum() / mask.sum())


def test_actor_update_reports_the_topk_forward_kl_of_its_own_distribution(model_dir, teacher_dir):
    config = distill_config(model_dir, teacher_dir, "distillation.distillation_loss.loss_mode=forward_kl_topk",
                            "distillation.distillation_loss.topk=6", "distillation.distillation_loss.use_task_rewards=false",
                            "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.rollout.n=1",
                            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "data.train_batch_size=4")
    batch = chat_rollout_batch()
    batch.batch.update(local_group(TeacherWorker, config).compute_teacher_log_prob(batch).batch)
    student = full_log_softmax(model_dir, batch).gather(-1, batch.batch["teacher_topk_ids"])
    teacher = batch.batch["teacher_topk_log_probs"]
    mask = batch.batch["response_mask"]
    expected = float((((teacher.exp() * (teacher - student)).sum(-1)).clamp_min(0) * mask).sum() / mask.sum())
    batch.batch["old_log_probs"] = torch.zeros_like(mask, dtype=torch.float32)
    batch.batch["advantages"] = torch.zeros_like(mask, dtype=torch.float32)
    metrics = local_group(ActorRolloutRefWorker, config, "actor").update_actor(batch).meta_info["metrics"]
    assert abs(metrics["distillation/loss"][0] - expected) < 1e-5
    masses = (teacher.exp().sum(-1) * mask).sum() / mask.sum()
    assert abs(metrics["distillation/teacher_mass"][0] - float(masses)) < 1e-5
