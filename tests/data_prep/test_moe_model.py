"""Sparse upcycling of a Llama model into Mixtral: with identical experts the MoE computes what the
dense model does; the noise makes the experts (and so the routing) differ."""

from __future__ import annotations

import torch

from rlvr.data_prep.moe_model import upcycle
from rlvr.utils.testing import tiny_causal_lm
from rlvr.workers.moe.routers import router_tap


def test_identical_experts_compute_the_dense_model_and_noise_sets_them_apart():
    dense, _ = tiny_causal_lm(seed=3)
    ids = torch.randint(4, 260, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = dense(ids).logits
        same = upcycle(dense, experts=4, top_k=2, noise=0.0, seed=0)
        torch.testing.assert_close(same(ids).logits, expected, rtol=0, atol=1e-5)
        apart = upcycle(dense, experts=4, top_k=2, noise=0.01, seed=0)
        moved = float((apart(ids).logits - expected).abs().max())
    assert 1e-4 < moved < 0.5
    experts = apart.model.layers[0].mlp.experts.gate_up_proj
    assert experts.shape[0] == 4 and not torch.equal(experts[0], experts[1])
    gate_up = torch.cat([dense.model.layers[0].mlp.gate_proj.weight, dense.model.layers[0].mlp.up_proj.weight])
    assert float((experts[2] - gate_up).abs().max()) < 0.01 * 6 * float(gate_up.std())  # within 6 sigma of the noise
    tap = router_tap(apart)
    assert (tap.shape.layers, tap.shape.num_experts, tap.shape.top_k) == (2, 4, 2)
