"""Rule scorers by data source.

``default_compute_score(data_source, solution_str, ground_truth, extra_info=None)`` looks the
data source up in the scorer registry and calls its scorer; an unknown data source raises
:class:`UnknownDataSourceError` listing the known ones. Add a scorer with::

    @register_scorer("my_dataset")
    def compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict | None: ...

Built-in data sources: ``openai/gsm8k``/``gsm8k`` (verl's strict ``#### ``), ``gsm8k_flexible``,
``gsm8k_lenient``, ``math`` and the MATH hub names (math-verify; also ``hiyouga/geometry3k``), ``multiple_choice``,
``countdown``, ``vision_shapes`` (the vision job's one-word answers), and ``reasoning_gym/<task>`` for
every reasoning-gym task. The scorers of the reward
workers (code, IFEval, judge, detection) live here too and take their own arguments.
"""

from rlvr.reward.scorers import (  # noqa: F401 - registers
    countdown, gsm8k, math, multiple_choice, reasoning_gym, vision_shapes,
)
from rlvr.reward.scorers.registry import (
    SCORER_REGISTRY,
    ScorerArgumentError,
    ScorerTimeoutError,
    UnknownDataSourceError,
    default_compute_score,
    get_scorer,
    register_scorer,
)

__all__ = [
    "SCORER_REGISTRY",
    "ScorerArgumentError",
    "ScorerTimeoutError",
    "UnknownDataSourceError",
    "default_compute_score",
    "get_scorer",
    "register_scorer",
]
