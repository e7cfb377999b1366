"""verl's ``verl.utils.metric``: :class:`Metric`, :class:`AggregationType` and :func:`reduce_metrics`."""

from rlvr.utils.metric.utils import AggregationType, Metric, reduce_metrics

__all__ = ["AggregationType", "Metric", "reduce_metrics"]
