"""Rollout engines: the protocol, the registry, the default transformers engine (``"hf"``) and the
vLLM engine (``"vllm"``; vLLM itself is imported only when that engine is built)."""

from rlvr.workers.rollout.base import (
    ROLLOUT_ENGINES,
    RolloutEngine,
    get_rollout_engine,
    register_rollout_engine,
)
from rlvr.workers.rollout.hf_rollout import HFRollout
from rlvr.workers.rollout.sampling import SamplingParams, resolve_sampling, sample_tokens
from rlvr.workers.rollout.vllm_rollout import VLLMRollout

__all__ = [
    "ROLLOUT_ENGINES",
    "RolloutEngine",
    "HFRollout",
    "VLLMRollout",
    "SamplingParams",
    "get_rollout_engine",
    "register_rollout_engine",
    "resolve_sampling",
    "sample_tokens",
]
