"""Metric values that workers collect per micro-batch and the driver reduces (verl's
``verl.utils.metric.utils``).

A worker reports a metric either as a plain list of values (reduced by its name: a last path
component containing ``max`` takes the maximum, ``min`` the minimum, anything else the mean) or as
a :class:`Metric`, which carries its own reduction (:class:`AggregationType`).
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Union

import numpy as np
import torch

__all__ = ["AggregationType", "Metric", "reduce_metrics"]


class AggregationType(Enum):
    """How the values of a :class:`Metric` become one number."""

    MEAN = "mean"
    SUM = "sum"
    MIN = "min"
    MAX = "max"


_REDUCERS = {AggregationType.MEAN: np.mean, AggregationType.SUM: np.sum,
             AggregationType.MIN: np.min, AggregationType.MAX: np.max}
_NUMERIC = (int, float, np.number, np.ndarray, torch.Tensor)


class Metric:
    """Values of one metric (e.g. one per micro-batch) and how to reduce them.

    Args:
        aggregation: ``"mean"`` / ``"sum"`` / ``"min"`` / ``"max"`` or an :class:`AggregationType`.
        value: an initial value or list of values (optional).

    Raises:
        ValueError: an unknown aggregation, a value that is not a number or a scalar tensor.
    """

    def __init__(self, aggregation: str | AggregationType, value: Any = None) -> None:
        try:
            self.aggregation = aggregation if isinstance(aggregation, AggregationType) else AggregationType(aggregation)
        except ValueError as err:
            raise ValueError(f"Unsupported aggregation type: {aggregation!r}; use one of "
                             f"{[a.value for a in AggregationType]}") from err
        self.values: list[Any] = []
        if value is not None:
            self.extend(value) if isinstance(value, list) else self.append(value)

    def __repr__(self) -> str:
        return f"Metric({self.aggregation.value}, {self.values})"

    def append(self, value: Union[int, float, torch.Tensor, np.ndarray, "Metric"]) -> None:
        """Add one value (a scalar tensor becomes a float); a :class:`Metric` adds all its values."""
        if isinstance(value, Metric):
            self.extend(value)
            return
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ValueError(f"Only scalar tensors can be converted to float; got shape {tuple(value.shape)}")
            value = value.detach().item()
        if not isinstance(value, _NUMERIC):
            raise ValueError(f"Unsupported value type: {type(value).__name__} (a metric value is a number)")
        self.values.append(value)

    def extend(self, values: Union[list[Any], "Metric"]) -> None:
        """Add several values, or every value of another :class:`Metric` of the same aggregation."""
        if isinstance(values, Metric):
            if values.aggregation != self.aggregation:
                raise ValueError(f"Aggregation type mismatch: {self.aggregation} != {values.aggregation}")
            values = values.values
        for value in values:
            self.append(value)

    def aggregate(self) -> float:
        """The values reduced by this metric's aggregation."""
        return _REDUCERS[self.aggregation](self.values)

    @classmethod
    def aggregate_dp(cls, metric_lists: list[Metric]) -> float:
        """One number from the same metric on every data-parallel rank (``[dp][micro-batch]``).

        ``MEAN`` / ``SUM``: the per-micro-batch mean over the ranks, then the aggregation over the
        micro-batches; ``MIN`` / ``MAX``: over every value of every rank.

        Raises:
            ValueError: no metrics, or ranks with different numbers of values.
        """
        if not metric_lists:
            raise ValueError("Cannot aggregate an empty list of metrics.")
        lengths = [len(m.values) for m in metric_lists]
        if len(set(lengths)) != 1:
            raise ValueError(f"All Metric instances must have the same number of values for dp aggregation: {lengths}")
        table = np.array([m.values for m in metric_lists])  # [dp, micro-batches]
        aggregation = metric_lists[0].aggregation
        if aggregation in (AggregationType.MEAN, AggregationType.SUM):
            return _REDUCERS[aggregation](table.mean(axis=0))
        return _REDUCERS[aggregation](table.reshape(-1))

    @classmethod
    def from_dict(cls, data: dict[str, Any], aggregation: str | AggregationType) -> dict[str, Metric]:
        """``{name: Metric(aggregation, value)}`` for each entry of ``data``."""
        return {key: cls(aggregation=aggregation, value=value) for key, value in data.items()}

    def init_list(self) -> Metric:
        """An empty :class:`Metric` with this one's aggregation."""
        return Metric(aggregation=self.aggregation)


def _reducer_by_name(key: str) -> Any:
    """max / min / mean by the last ``/`` component of the metric name (verl's rule, which reads the
    whole name; rlvr reads the last component so that a data source such as ``minerva_math`` in
    ``reward/minerva_math/score`` does not select ``min``)."""
    leaf = key.rsplit("/", 1)[-1]
    if "max" in leaf:
        return np.max
    if "min" in leaf:
        return np.min
    return np.mean


def reduce_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """One number per metric: a :class:`Metric` by its aggregation, a list (or a scalar) by its name.

    Args:
        metrics: name -> :class:`Metric`, list of numbers, or a number.

    Returns:
        A new dict name -> float (``nan`` for an empty list); ``metrics`` is not modified (verl
        replaces the values in place and returns the same dict).
    """
    reduced = {}
    for key, value in metrics.items():
        if isinstance(value, Metric):
            reduced[key] = float(value.aggregate())
        elif isinstance(value, (list, tuple, np.ndarray)) and len(value) == 0:
            reduced[key] = float("nan")
        else:
            reduced[key] = float(_reducer_by_name(key)(value))
    return reduced
