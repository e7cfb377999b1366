"""Staleness from per-token versions, against hand-computed values."""

from __future__ import annotations

import pytest
import torch

from rlvr.trainer.async_schedule.versions import check_staleness_bound, sample_staleness, staleness_metrics
from rlvr.utils.errors import StaleRolloutError

# four samples of a policy at version 5: one version, two versions (a partial rollout), an old one,
# and a row with no sampled token; -1 where the mask is 0
VERSIONS = torch.tensor([[5, 5, 5, -1],
                         [3, 3, 4, 4],
                         [2, 2, -1, -1],
                         [-1, -1, -1, -1]])
MASK = (VERSIONS >= 0).long()


def test_a_sample_is_as_stale_as_its_oldest_token():
    assert sample_staleness(VERSIONS, MASK, 5).tolist() == [0, 2, 3, 0]


def test_metrics_count_samples_by_staleness_and_tokens_by_lag():
    metrics = staleness_metrics(VERSIONS, MASK, policy_version=5, bound=3)
    assert metrics["async/staleness_mean"] == pytest.approx((0 + 2 + 3 + 0) / 4)
    assert metrics["async/staleness_max"] == 3.0
    assert metrics["async/mixed_version_samples"] == pytest.approx(1 / 4)
    # samples: staleness 0, 2, 3, 0; tokens (9 sampled): lags 0,0,0, 2,2,1,1, 3,3
    assert [metrics[f"async/samples_staleness_{k}"] for k in range(4)] == pytest.approx([0.5, 0.0, 0.25, 0.25])
    assert [metrics[f"async/tokens_lag_{k}"] for k in range(4)] == pytest.approx([3 / 9, 2 / 9, 2 / 9, 2 / 9])


def test_the_bound_is_enforced_on_the_oldest_token():
    check_staleness_bound(VERSIONS, MASK, 5, bound=3)
    with pytest.raises(StaleRolloutError, match="sample 2 is 3 weight versions older .* over the bound of 2"):
        check_staleness_bound(VERSIONS, MASK, 5, bound=2)
    with pytest.raises(StaleRolloutError, match="newer than the policy's version 4"):
        check_staleness_bound(VERSIONS, MASK, 4, bound=10)
