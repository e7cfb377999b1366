"""rollout/moe/* metrics from the rollout's routes, against hand-computed values."""

from __future__ import annotations

import pytest
import torch

from rlvr.trainer.ppo.moe_metrics import RolloutMoeMetrics, load_violation_metrics, rollout_expert_counts


def _routes() -> tuple[torch.Tensor, torch.Tensor]:
    """2 rows, prompt 1 column + 3 response columns, 1 layer, top-1, 4 experts."""
    routes = torch.tensor([[[[0]], [[1]], [[1]], [[-1]]],
                           [[[2]], [[3]], [[-1]], [[-1]]]], dtype=torch.int16)
    response_mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    return routes, response_mask


def test_counts_cover_the_response_tokens_with_a_known_route():
    routes, mask = _routes()
    # row 0: responses 1, 1 and an unknown last token; row 1: 3 (prompt column 2 is not counted)
    assert rollout_expert_counts(routes, mask, 4).tolist() == [[0, 2, 0, 1]]


def test_violations_by_hand():
    metrics = load_violation_metrics(torch.tensor([[0, 2, 0, 1], [1, 1, 1, 1]]))
    # layer 0: shares 0, 2/3, 0, 1/3 -> E*q - 1 = -1, 5/3, -1, 1/3
    assert metrics["rollout/moe/max_vio/layer_0"] == pytest.approx(5 / 3)
    assert metrics["rollout/moe/min_vio/layer_0"] == pytest.approx(-1.0)
    assert metrics["rollout/moe/avg_vio/layer_0"] == pytest.approx((1 + 5 / 3 + 1 + 1 / 3) / 4)
    assert metrics["rollout/moe/max_vio/layer_1"] == pytest.approx(0.0)
    assert metrics["rollout/moe/max_vio/max"] == pytest.approx(5 / 3)
    assert metrics["rollout/moe/max_vio/avg"] == pytest.approx(5 / 6)


def test_accumulated_over_the_interval():
    routes, mask = _routes()
    acc = RolloutMoeMetrics(2)
    assert acc.update(routes, mask, 4, step=1) == {}
    metrics = acc.update(routes, mask, 4, step=2)
    assert metrics["rollout/moe/routed_expert_assignments"] == 6.0
    assert metrics["rollout/moe/routed_experts_found"] == 1.0
    assert metrics["rollout/moe/max_vio/layer_0"] == pytest.approx(5 / 3)  # the same shares, twice
    assert acc.counts is None and RolloutMoeMetrics(0).update(routes, mask, 4, step=2) == {}
