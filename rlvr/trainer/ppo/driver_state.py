"""Checkpoints of the PPO trainer's driver (a mixin of
:class:`~rlvr.trainer.ppo.ray_trainer.RayPPOTrainer`).

A checkpoint holds the worker groups' states (actor, and critic when there is one) and the driver
state that makes a resumed run continue exactly: the step, the data position, the driver's RNG
states, the adaptive KL controller and the kept validation generations; with a rollout apart from
the actor also the prompts drawn but not trained yet (in flight or buffered, with their versions)
and the policy version, so a resume generates those prompts again first. Saving, resuming per
``trainer.resume_mode`` and, after a worker failure, restoring the newest whole checkpoint of the
run (or the run's start), after starting the worker groups again, and the retries of a start or
a resume that a worker failure interrupted, live here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlvr.trainer.checkpoint import CheckpointError
from rlvr.trainer.progress import TrainingProgress
from rlvr.trainer.recovery import RECOVERABLE_ERRORS
from rlvr.utils.seed import get_rng_state, set_rng_state

__all__ = ["DriverStateMixin"]


class DriverStateMixin:
    """The trainer's checkpoint and recovery methods (they use its ``checkpoints``, worker groups,
    ``_start_workers``, ``shutdown``, ``recovers``, ``train_iter``, ``async_rollout``, ``kl_ctrl_in_reward``,
    ``val_generations``, ``global_steps``, ``recovery``, ``tracker`` and ``metrics_history``)."""

    def _driver_state(self) -> dict[str, Any]:
        """What the driver needs to continue exactly: step, data position, RNG, KL controller (and
        the asynchronous rollout's unfinished prompts, taken with the data position at one instant)."""
        state = {"global_steps": self.global_steps, "data": self.train_iter.state_dict(),
                 "driver_rng": get_rng_state(),
                 "kl_ctrl": self.kl_ctrl_in_reward.state_dict() if self.kl_ctrl_in_reward else None,
                 "val_generations": list(self.val_generations)}
        if self.async_rollout is not None:
            state["async_rollout"] = self.async_rollout.state_dict()
            state["data"] = state["async_rollout"]["data"]
        return state

    def _restore_driver_state(self, state: dict[str, Any]) -> None:
        self.train_iter.load_state_dict(state["data"])
        if self.async_rollout is not None:
            self.async_rollout.load_state_dict(state["async_rollout"])
        set_rng_state(state["driver_rng"])
        if self.kl_ctrl_in_reward is not None:
            self.kl_ctrl_in_reward.load_state_dict(state["kl_ctrl"])
        self.val_generations = list(state["val_generations"])
        self.global_steps = int(state["global_steps"])

    def _checkpointed_groups(self) -> dict[str, Any]:
        """Checkpoint sub-folder -> the worker group whose state it holds."""
        return {"actor": self.actor_rollout_wg, **({"critic": self.critic_wg} if self.use_critic else {})}

    def _save_checkpoint(self) -> None:
        """Write ``global_step_<k>``: worker states, then the driver state, then the manifest."""
        exports = frozenset({"actor"} if "hf_model" in self.config.actor_rollout_ref.actor.checkpoint.save_contents
                            else set())
        self.checkpoints.save(self.global_steps, self._checkpointed_groups(), self._driver_state(), hf_exports=exports)
        self._last_save_step = self.global_steps

    def _load_checkpoint(self) -> int | None:
        """Resume per ``trainer.resume_mode``; returns the restored step or None."""
        cfg = self.config.trainer
        path = self.checkpoints.to_resume(cfg.resume_mode, cfg.resume_from_path)
        if path is None:
            return None
        self._restore_driver_state(self.checkpoints.load(path, self._checkpointed_groups()))
        return self.global_steps

    def _restart_and_load_checkpoint(self) -> int | None:
        """After a worker failed while the resume checkpoint was loading: start every group again
        and load it again."""
        self._restart_workers()
        return self._load_checkpoint()

    def _restore_last_checkpoint(self) -> int:
        """Load the newest whole checkpoint of this run, or go back to the run's start; returns the step."""
        path = self.checkpoints.last_whole()
        if path is not None:
            self._restore_driver_state(self.checkpoints.load(path, self._checkpointed_groups()))
        elif self._start_state is not None:
            self._restore_driver_state(self._start_state)
        else:
            raise CheckpointError("no whole checkpoint of this run is left to restore after a worker failure; "
                                  "resume from an older one with trainer.resume_mode=resume_path")
        return self.global_steps

    def _with_worker_restarts(self, first: Callable[[], Any], again: Callable[[], Any]) -> Any:
        """``first()``, or, when a worker dies or hangs in it (Ray backend), ``again()`` until it
        succeeds; every failure counts against ``trainer.max_restarts`` and the first is recorded as
        a restart with nothing to redo. Returns what the call that succeeded returned."""
        attempt, first_failure = first, None
        while True:
            try:
                result = attempt()
                break
            except RECOVERABLE_ERRORS if self.recovers else () as error:
                started = self.recovery.admit(error, self.global_steps)
                first_failure = first_failure or (error, started)
                attempt = again
        if first_failure is not None:
            self.recovery.record(first_failure[0], self.global_steps, self.global_steps, first_failure[1])
        return result

    def _restart_workers(self) -> None:
        """Tear every worker group down (hung workers too) and start them all again, models loaded."""
        self.shutdown()
        self._start_workers()
        self.workers.restart_stateless()

    def _recover(self, error: Any, progress: TrainingProgress) -> None:
        """Restart every worker group and restore the last whole checkpoint of this run (or the
        run's start); raises :class:`~rlvr.trainer.recovery.RestartLimitError` past the budget."""
        failed_step = self.global_steps
        started = self.recovery.admit(error, failed_step)
        while True:
            try:
                self._restart_workers()
                restored = self._restore_last_checkpoint()
                break
            except RECOVERABLE_ERRORS as again:  # a worker failed while starting: that counts too
                self.recovery.admit(again, failed_step)
        self.metrics_history = [row for row in self.metrics_history if row["step"] <= restored]
        self.tracker.rewind(restored)
        progress.rewind(restored)
        self._last_val_step = self._last_save_step = restored
        self.recovery.record(error, failed_step, restored, started)
