"""Vocabulary-parallel log-probs and entropy (pure torch): one rank's slice against a float64
log-softmax over the whole vocabulary, values and gradients; padding columns left out; the slices
of several ranks add up (their reductions are simulated by summing the per-slice statistics)."""

from __future__ import annotations

import pytest
import torch

from rlvr.workers.megatron.vocab_parallel import vocab_parallel_log_probs


def _reference(logits: torch.Tensor, labels: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    log_p = (logits.double() / temperature).log_softmax(-1)
    return log_p.gather(-1, labels[..., None]).squeeze(-1), -(log_p.exp() * log_p).sum(-1)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_one_rank_matches_a_float64_log_softmax_with_gradients(temperature):
    torch.manual_seed(0)
    logits = (torch.randn(3, 5, 50) * 4).requires_grad_(True)
    labels = torch.randint(0, 50, (3, 5))
    log_probs, entropy = vocab_parallel_log_probs(logits, labels, 0, 50, temperature=temperature, with_entropy=True)
    ref_lp, ref_ent = _reference(logits, labels, temperature)
    assert (log_probs.double() - ref_lp).abs().max() < 1e-5 and (entropy.double() - ref_ent).abs().max() < 1e-5
    weights = torch.randn(3, 5)
    (grad,) = torch.autograd.grad((log_probs * weights).sum() + 0.3 * entropy.sum(), logits)
    ref_logits = logits.detach().double().requires_grad_(True)
    ref_lp, ref_ent = _reference(ref_logits, labels, temperature)
    (ref_grad,) = torch.autograd.grad((ref_lp * weights.double()).sum() + 0.3 * ref_ent.sum(), ref_logits)
    assert (grad.double() - ref_grad).abs().max() < 1e-5


def test_padding_columns_past_the_vocabulary_are_left_out():
    torch.manual_seed(1)
    logits = torch.randn(4, 12)
    padded = torch.cat([logits, torch.full((4, 4), 50.0)], dim=-1)  # huge padding logits must not count
    labels = torch.tensor([0, 5, 11, 3])
    log_probs, entropy = vocab_parallel_log_probs(padded, labels, 0, 12, with_entropy=True)
    ref_lp, ref_ent = _reference(logits, labels, 1.0)
    assert (log_probs.double() - ref_lp).abs().max() < 1e-6 and (entropy.double() - ref_ent).abs().max() < 1e-6
    with pytest.raises(ValueError, match="past the vocabulary"):
        vocab_parallel_log_probs(padded, labels, 12, 12)
