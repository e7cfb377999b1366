"""The chunked LM-head log-probs agree with log_softmax over full logits, values and gradients."""

from __future__ import annotations

import math

import pytest
import torch

from rlvr.workers.actor.linear_log_probs import chunk_tokens_for, linear_log_probs


def reference(hidden, weight, labels, temperature):
    logits = (hidden @ weight.t()).float() / temperature
    log_probs = torch.log_softmax(logits, dim=-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return log_probs.gather(-1, labels[..., None]).squeeze(-1), entropy


@pytest.mark.parametrize("chunk", [1, 3, 64])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_values_and_gradients_match_full_logits(chunk, temperature):
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 5, 8, generator=gen, dtype=torch.float64)
    weight = torch.randn(11, 8, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 11, (2, 5), generator=gen)
    grad_out = torch.randn(2, 5, generator=gen, dtype=torch.float64)

    h1, w1 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    lp, ent = linear_log_probs(h1, w1, labels, temperature, chunk=chunk, with_entropy=True)
    (lp * grad_out).sum().backward()
    h2, w2 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    ref_lp, ref_ent = reference(h2, w2, labels, temperature)
    (ref_lp * grad_out).sum().backward()

    assert lp.shape == (2, 5) and lp.dtype == torch.float32
    torch.testing.assert_close(lp, ref_lp.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, ref_ent.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h1.grad, h2.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w1.grad, w2.grad, rtol=1e-5, atol=1e-5)


def test_hand_computed_two_token_vocabulary():
    # h = 1, W = [[ln 3], [0]]: logits (ln 3, 0) -> p = (3/4, 1/4)
    hidden = torch.ones(1, 1, requires_grad=True)
    weight = torch.tensor([[math.log(3.0)], [0.0]], requires_grad=True)
    lp, ent = linear_log_probs(hidden, weight, torch.tensor([1]), with_entropy=True)
    assert lp.item() == pytest.approx(math.log(0.25), abs=1e-6)
    assert ent.item() == pytest.approx(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)), abs=1e-6)
    lp.sum().backward()
    # d log p1 / dz = onehot(1) - p = (-3/4, 3/4); dz/dh = W, dz/dW = h
    assert hidden.grad.item() == pytest.approx(-0.75 * math.log(3.0), abs=1e-6)
    torch.testing.assert_close(weight.grad, torch.tensor([[-0.75], [0.75]]))


def test_no_entropy_by_default_and_bad_temperature():
    lp, ent = linear_log_probs(torch.zeros(3, 2), torch.zeros(4, 2), torch.tensor([0, 1, 3]))
    assert ent is None
    torch.testing.assert_close(lp, torch.full((3,), math.log(0.25)))
    with pytest.raises(ValueError, match="temperature must be positive"):
        linear_log_probs(torch.zeros(1, 2), torch.zeros(4, 2), torch.tensor([0]), temperature=0.0)


def test_chunk_size_follows_the_memory_budget():
    assert chunk_tokens_for(49152, torch.device("cpu")) == (32 << 20) // (4 * 49152)
    assert chunk_tokens_for(10**12, torch.device("cpu")) == 1
