"""The load-balancing loss against transformers' own function and a plain loop, and the expert-load
statistics against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

from rlvr.workers.moe.balance import expert_counts, load_balancing_loss, load_entropy

E, K = 8, 2


def _routing(tokens: int, layers: int, seed: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    logits = [torch.randn(tokens, E, generator=gen, dtype=torch.float64) for _ in range(layers)]
    selected = [lg.softmax(-1).topk(K, dim=-1).indices for lg in logits]
    return logits, selected


def _loop_loss(logits: list[torch.Tensor], selected: list[torch.Tensor], mask: torch.Tensor) -> float:
    """E * sum_e f_e P_e over the real tokens of all layers, one token at a time."""
    chosen, prob, tokens = [0.0] * E, [0.0] * E, 0
    for layer_logits, layer_selected in zip(logits, selected):
        for t in range(layer_logits.shape[0]):
            if not mask[t]:
                continue
            tokens += 1
            p = layer_logits[t].softmax(-1)
            for e in range(E):
                prob[e] += float(p[e])
                chosen[e] += float((layer_selected[t] == e).sum())
    return E * sum((chosen[e] / tokens) * (prob[e] / tokens) for e in range(E))


def test_loss_equals_transformers_and_a_loop():
    logits, selected = _routing(tokens=12, layers=3, seed=0)
    everything = torch.ones(12, dtype=torch.bool)
    ours = load_balancing_loss(logits, selected, everything, E)
    theirs = load_balancing_loss_func(tuple(logits), E, K)
    assert float(ours) == pytest.approx(float(theirs), rel=1e-6)
    assert float(ours) == pytest.approx(_loop_loss(logits, selected, everything), rel=1e-6)


def test_padding_tokens_do_not_count():
    logits, selected = _routing(tokens=3 * 5, layers=2, seed=1)
    attention = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 0, 0], [0, 0, 1, 1, 1]])
    mask = attention.flatten().bool()
    ours = load_balancing_loss(logits, selected, mask, E)
    theirs = load_balancing_loss_func(tuple(logits), E, K, attention_mask=attention)
    assert float(ours) == pytest.approx(float(theirs), rel=1e-6)
    assert float(ours) == pytest.approx(_loop_loss(logits, selected, mask), rel=1e-6)
    # the padding's logits get no gradient
    leaves = [lg.clone().requires_grad_(True) for lg in logits]
    load_balancing_loss(leaves, selected, mask, E).backward()
    assert all(float(leaf.grad[~mask].abs().max()) == 0.0 for leaf in leaves)
    assert all(float(leaf.grad[mask].abs().max()) > 0.0 for leaf in leaves)


def test_the_loss_is_one_when_the_load_is_uniform():
    # 8 tokens, each choosing a distinct pair; equal logits: f_e = 2/8 * ... -> E * sum(k/E * 1/E) = k
    logits = [torch.zeros(4, E)]
    selected = [torch.tensor([[0, 1], [2, 3], [4, 5], [6, 7]])]
    assert float(load_balancing_loss(logits, selected, torch.ones(4, dtype=torch.bool), E)) == pytest.approx(K)


def test_counts_and_entropy_by_hand():
    selected = [torch.tensor([[0, 1], [0, 2], [5, 5]]), torch.tensor([[3, 4], [3, 4], [3, 4]])]
    counts = expert_counts(selected, torch.tensor([True, True, False]), E)
    assert counts.tolist() == [[2, 1, 1, 0, 0, 0, 0, 0], [0, 0, 0, 2, 2, 0, 0, 0]]
    entropy = load_entropy(counts)
    assert float(entropy[0]) == pytest.approx(-(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25)))
    assert float(entropy[1]) == pytest.approx(math.log(2))
    assert float(load_entropy(torch.full((1, E), 3.0))[0]) == pytest.approx(math.log(E))
    assert float(load_entropy(torch.zeros(1, E))[0]) == 0.0
