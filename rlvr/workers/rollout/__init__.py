"""Rollout engines: the protocol, the registry and the default transformers engine (``"hf"``)."""

from rlvr.workers.rollout.base import (
    ROLLOUT_ENGINES,
    RolloutEngine,
    get_rollout_engine,
    register_rollout_engine,
)
from rlvr.workers.rollout.hf_rollout import HFRollout
from rlvr.workers.rollout.sampling import SamplingParams, resolve_sampling, sample_tokens

__all__ = [
    "ROLLOUT_ENGINES",
    "RolloutEngine",
    "HFRollout",
    "SamplingParams",
    "get_rollout_engine",
    "register_rollout_engine",
    "resolve_sampling",
    "sample_tokens",
]
