"""The distillation losses against the loop reference written from verl's formulas (1e-6): the KL
estimators, top-k forward KL with its clamps and masses, the loss clamp, the direct and the
policy-gradient forms, and the combination with the task rewards' policy loss."""

from __future__ import annotations

import pytest
import torch

import distillation_reference as ref
import ppo_reference_impl as ppo_ref
from ppo_test_data import make_mask
from rlvr.trainer.ppo.distillation import (
    DISTILLATION_LOSS_REGISTRY,
    TeacherScores,
    combine_with_policy_loss,
    distillation_loss,
    distillation_metric_names,
    distillation_token_losses,
    get_distillation_loss,
)
from rlvr.trainer.ppo.distillation_config import DistillationLossConfig

K, VOCAB = 4, 11


def as_lists(tensor: torch.Tensor) -> list:
    return tensor.double().tolist()


def _config(**fields) -> DistillationLossConfig:
    return DistillationLossConfig(**fields)


def _sampled(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    student = torch.rand(8, 7, generator=gen) * -4.0
    teacher = torch.rand(8, 7, generator=gen) * -4.0
    teacher[0, 0] = -60.0  # a token the teacher finds impossible: the +-20 / +-10 clamps of k3 act
    return student, teacher


def _topk(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Student and teacher log-probs of the teacher's top-k tokens ``[8, 7, K]`` (from full softmaxes)."""
    gen = torch.Generator().manual_seed(seed)
    teacher_full = (torch.randn(8, 7, VOCAB, generator=gen) * 2).log_softmax(-1)
    student_full = (torch.randn(8, 7, VOCAB, generator=gen) * 2).log_softmax(-1)
    values, ids = teacher_full.topk(K, dim=-1)
    return student_full.gather(-1, ids), values


@pytest.mark.parametrize("mode", ["k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl"])
@pytest.mark.parametrize("clamp", [None, 0.5])
def test_kl_estimator_losses_match_the_reference(mode, clamp):
    student, teacher = _sampled(1)
    losses, diagnostics = distillation_token_losses(TeacherScores(mode, student, teacher), _config(loss_mode=mode,
                                                                                                   loss_max_clamp=clamp))
    expected = ref.token_losses(mode, as_lists(student), as_lists(teacher), loss_max_clamp=clamp)
    assert torch.allclose(losses, torch.tensor(expected, dtype=torch.float32), atol=1e-6)
    unclamped = ref.token_losses(mode, as_lists(student), as_lists(teacher))
    assert torch.allclose(diagnostics["abs_loss"], torch.tensor(unclamped).abs().float(), atol=1e-6)


@pytest.mark.parametrize("log_prob_min_clamp", [None, -2.0])
@pytest.mark.parametrize("loss_max_clamp", [None, 0.3])
def test_forward_kl_topk_matches_the_reference(log_prob_min_clamp, loss_max_clamp):
    student, teacher = _topk(2)
    config = _config(loss_mode="forward_kl_topk", topk=K, log_prob_min_clamp=log_prob_min_clamp,
                     loss_max_clamp=loss_max_clamp)
    scores = TeacherScores("forward_kl_topk", torch.zeros(8, 7), student_topk_log_probs=student,
                           teacher_topk_log_probs=teacher)
    losses, diagnostics = distillation_token_losses(scores, config)
    s, t = student.double().tolist(), teacher.double().tolist()
    expected = ref.token_losses("forward_kl_topk", s, t, loss_max_clamp, log_prob_min_clamp)
    assert torch.allclose(losses, torch.tensor(expected, dtype=torch.float32), atol=1e-6)
    masses = [[ref.forward_kl_topk(a, b) for a, b in zip(sr, tr)] for sr, tr in zip(s, t)]
    assert torch.allclose(diagnostics["student_mass"], torch.tensor([[m[1] for m in r] for r in masses]).float(), atol=1e-6)
    assert torch.allclose(diagnostics["teacher_mass"], torch.tensor([[m[2] for m in r] for r in masses]).float(), atol=1e-6)
    assert float(losses.min()) >= 0.0


def test_forward_kl_topk_is_the_full_forward_kl_when_k_covers_the_vocabulary():
    gen = torch.Generator().manual_seed(3)
    teacher = (torch.randn(2, 3, VOCAB, generator=gen)).log_softmax(-1)
    student = (torch.randn(2, 3, VOCAB, generator=gen)).log_softmax(-1)
    scores = TeacherScores("forward_kl_topk", torch.zeros(2, 3), student_topk_log_probs=student,
                           teacher_topk_log_probs=teacher)
    losses, _ = distillation_token_losses(scores, _config(loss_mode="forward_kl_topk"))
    exact = (teacher.exp() * (teacher - student)).sum(-1)  # KL(teacher || student) over the whole vocabulary
    assert torch.allclose(losses, exact, atol=1e-6)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_direct_loss_is_the_aggregated_token_loss(mode):
    student, teacher = _sampled(4)
    mask = make_mask(empty_row=True)
    config = _config(loss_mode="k3", loss_max_clamp=2.0)
    loss, metrics = distillation_loss(TeacherScores("k3", student, teacher), config, mask, mode)
    tokens = ref.token_losses("k3", as_lists(student), as_lists(teacher), loss_max_clamp=2.0)
    assert abs(float(loss) - ppo_ref.agg_loss(tokens, as_lists(mask), mode)) < 1e-6
    assert abs(float(metrics["distillation/loss"]) - ppo_ref.masked_mean(tokens, as_lists(mask))) < 1e-6
    assert sorted(metrics) == sorted(distillation_metric_names(config))


def test_policy_gradient_form_uses_the_negative_loss_as_advantage():
    student, teacher = _sampled(5)
    gen = torch.Generator().manual_seed(6)
    old = student + torch.randn(8, 7, generator=gen) * 0.3
    mask = make_mask()
    config = _config(loss_mode="k1", use_policy_gradient=True, clip_ratio=0.2, clip_ratio_low=0.1, clip_ratio_high=0.3)
    student.requires_grad_(True)
    loss, metrics = distillation_loss(TeacherScores("k1", student, teacher), config, mask, "token-mean", old_log_prob=old)
    tokens = ref.token_losses("k1", as_lists(student.detach()), as_lists(teacher))
    advantages = [[-v for v in row] for row in tokens]
    expected, clipfrac, _, _ = ppo_ref.ppo_loss(as_lists(old), as_lists(student.detach()), advantages, as_lists(mask),
                                                0.1, 0.3, 3.0, "token-mean")
    assert abs(float(loss.detach()) - expected) < 1e-6
    assert abs(float(metrics["distillation/pg_clipfrac"]) - clipfrac) < 1e-6
    loss.backward()  # the advantage is detached: the gradient flows through the ratio only
    assert student.grad is not None and float(student.grad.abs().sum()) > 0


@pytest.mark.parametrize("use_task_rewards", [True, False])
def test_combination_with_the_task_rewards(use_task_rewards):
    config = _config(use_task_rewards=use_task_rewards, distillation_loss_coef=0.25)
    total = combine_with_policy_loss(torch.tensor(1.5), torch.tensor(0.8), config)
    assert abs(float(total) - ref.total_loss(1.5, 0.8, use_task_rewards, 0.25)) < 1e-6


def test_registry_names_and_settings():
    assert DISTILLATION_LOSS_REGISTRY.names() == ["abs", "forward_kl_topk", "k1", "k2", "k3", "kl", "low_var_kl", "mse"]
    assert get_distillation_loss("forward_kl_topk")[1].uses_topk
    assert not get_distillation_loss("k3")[1].uses_topk
    with pytest.raises(KeyError, match="k4.*valid names.*forward_kl_topk"):
        get_distillation_loss("k4")
