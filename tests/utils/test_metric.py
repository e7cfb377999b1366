"""verl's Metric / AggregationType / reduce_metrics (``rlvr.utils.metric``), by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rlvr.utils.metric import AggregationType, Metric, reduce_metrics
from rlvr.utils.py_functional import append_to_dict


def test_metric_collects_and_aggregates():
    metric = Metric("sum", [1, 2.5])
    metric.append(torch.tensor(0.5))
    metric.extend(Metric(AggregationType.SUM, 1.0))
    assert metric.values == [1, 2.5, 0.5, 1.0] and metric.aggregate() == 5.0
    assert Metric("mean", [1.0, 2.0, 6.0]).aggregate() == 3.0
    assert Metric("min", [3, -1]).aggregate() == -1 and Metric("max", [3, -1]).aggregate() == 3
    assert Metric("max").init_list().aggregation is AggregationType.MAX
    assert {k: m.values for k, m in Metric.from_dict({"a": 1.0, "b": 2}, "mean").items()} == {"a": [1.0], "b": [2]}


def test_metric_refuses_bad_input():
    with pytest.raises(ValueError, match="Unsupported aggregation type"):
        Metric("median")
    with pytest.raises(ValueError, match="scalar tensors"):
        Metric("mean").append(torch.ones(2))
    with pytest.raises(ValueError, match="Unsupported value type: str"):
        Metric("mean").append("1.0")
    with pytest.raises(ValueError, match="mismatch"):
        Metric("mean").extend(Metric("sum", 1.0))


def test_aggregate_over_data_parallel_ranks():
    # two ranks, three micro-batches each
    mean = [Metric("mean", [1.0, 2.0, 3.0]), Metric("mean", [3.0, 4.0, 5.0])]
    assert Metric.aggregate_dp(mean) == 3.0  # per-micro-batch means 2, 3, 4 -> 3
    total = [Metric("sum", [1.0, 2.0, 3.0]), Metric("sum", [3.0, 4.0, 5.0])]
    assert Metric.aggregate_dp(total) == 9.0  # 2 + 3 + 4
    assert Metric.aggregate_dp([Metric("max", [1.0, 7.0]), Metric("max", [3.0, 2.0])]) == 7.0
    with pytest.raises(ValueError, match="same number of values"):
        Metric.aggregate_dp([Metric("mean", [1.0]), Metric("mean", [1.0, 2.0])])
    with pytest.raises(ValueError, match="empty"):
        Metric.aggregate_dp([])


def test_reduce_metrics_by_name_and_by_metric():
    reduced = reduce_metrics({"loss": [1.0, 2.0], "actor/grad_norm_max": [1.0, 4.0], "agent/num_turns/min": [3, 2],
                              "reward/minerva_math/score": [1.0, 0.0], "custom": Metric("sum", [1, 2]),
                              "empty": [], "scalar": 2})
    assert reduced == {"loss": 1.5, "actor/grad_norm_max": 4.0, "agent/num_turns/min": 2.0,
                       "reward/minerva_math/score": 0.5, "custom": 3.0, "empty": reduced["empty"], "scalar": 2.0}
    assert math.isnan(reduced["empty"]) and all(type(v) is float for v in reduced.values())


def test_append_to_dict_keeps_metrics_as_metrics():
    data: dict = {}
    append_to_dict(data, {"a": 1.0, "m": Metric("max", 2.0), "l": [1, 2]}, prefix="actor/")
    append_to_dict(data, {"actor/a": 3.0, "m": Metric("max", 5.0)}, prefix="actor/")
    assert data["actor/a"] == [1.0, 3.0] and data["actor/l"] == [1, 2]
    assert isinstance(data["actor/m"], Metric) and data["actor/m"].values == [2.0, 5.0]
    assert reduce_metrics(data)["actor/m"] == 5.0 and np.isclose(reduce_metrics(data)["actor/a"], 2.0)
