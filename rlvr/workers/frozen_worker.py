"""``FrozenModelWorker``: the worker base of the frozen models that run as worker groups of their
own (the reward model, :mod:`rlvr.workers.reward_model`; the teacher, :mod:`rlvr.workers.teacher`).
How a frozen model is held is :mod:`rlvr.workers.frozen`."""

from __future__ import annotations

from abc import ABC, abstractmethod

from rlvr.single_controller.base.decorator import Dispatch, register
from rlvr.workers.engine_workers import TrainingWorker
from rlvr.workers.frozen import FrozenModel

__all__ = ["FrozenModelWorker"]


class FrozenModelWorker(TrainingWorker, ABC):
    """Base of the workers that hold one frozen model as a worker group of their own (reward model,
    teacher): the shared setup (process group, seed, threads) and :meth:`init_model`, which calls
    :meth:`_build` to make ``self.frozen`` (a :class:`FrozenModel`).

    Args:
        config: the whole run config.
    """

    def __init__(self, config) -> None:
        super().__init__(config)
        self.frozen: FrozenModel | None = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Join the process group, seed, then load and shard the frozen model (:meth:`_build`)."""
        self._setup()
        self._build()

    @abstractmethod
    def _build(self) -> None:
        """Load the model and set ``self.frozen``."""

    def _require_built(self, method: str) -> FrozenModel:
        if self.frozen is None:
            raise RuntimeError(f"{type(self).__name__}.{method}() called before init_model(); call init_model first")
        return self.frozen
