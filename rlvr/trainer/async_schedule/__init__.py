"""Asynchronous training: a rollout apart from the actor, overlapped with training.

Async is a schedule of the one trainer, not a second trainer: ``actor_rollout_ref.hybrid_engine=false``
places the rollout in a worker group of its own (:mod:`~rlvr.trainer.async_schedule.placement`), and
``async_training`` says how far ahead it may generate (:mod:`~rlvr.trainer.async_schedule.schedule`,
:mod:`~rlvr.trainer.async_schedule.buffer`). Staleness comes from the per-token weight versions
(:mod:`~rlvr.trainer.async_schedule.versions`); the correction is ``algorithm.rollout_correction``.
"""

from rlvr.trainer.async_schedule.buffer import SampleBuffer
from rlvr.trainer.async_schedule.prompts import PromptSource
from rlvr.trainer.async_schedule.schedule import (
    AsyncRollout,
    decoupled_ppo,
    prox_log_prob_from_update,
    rollout_correction_config,
)
from rlvr.trainer.async_schedule.versions import check_staleness_bound, sample_staleness, staleness_metrics

__all__ = ["AsyncRollout", "PromptSource", "SampleBuffer", "check_staleness_bound", "decoupled_ppo",
           "prox_log_prob_from_update", "rollout_correction_config", "sample_staleness", "staleness_metrics"]
