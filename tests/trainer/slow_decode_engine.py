"""A user module of the partial-rollout tests (imported through ``trainer.user_modules`` by the driver
and by the rollout worker's process): the rollout engine ``hf_slow_decode``, the HF engine with every
forward pass (prefill and each decode step) made :data:`DELAY_S` longer.

On the tiny model a generation of 32 tokens takes about as long as a training step, so whether a
weight push lands inside a generation (and the trained rows mix versions) depends on the machine's
timing. With the delay a generation takes about 0.7 s against a training step of 0.1-0.2 s: the
rollout is the slow side, the trainer's push arrives a few decode steps into the next generation,
and every batch after the first mixes two versions."""

from __future__ import annotations

import time

from rlvr.workers.rollout.base import register_rollout_engine
from rlvr.workers.rollout.hf_rollout import HFRollout

DELAY_S = 0.02
"""Seconds added before each forward pass of the rollout's model."""


def _pause(module, args) -> None:
    time.sleep(DELAY_S)


@register_rollout_engine("hf_slow_decode")
class SlowDecodeRollout(HFRollout):
    """:class:`HFRollout` whose model waits :data:`DELAY_S` before each forward pass."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.module.register_forward_pre_hook(_pause)
