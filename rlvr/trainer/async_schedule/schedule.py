"""The schedule of a rollout that runs apart from the actor: the one trainer, generation overlapped.

With ``actor_rollout_ref.hybrid_engine=false`` the trainer's steps stay what they are (reward,
log-probs, advantages, updates); only where a step's samples come from changes. A thread of the
driver, the *rollouter*, draws prompts, has the rollout worker group generate them and puts the
groups into a :class:`~rlvr.trainer.async_schedule.buffer.SampleBuffer`, as far ahead as
``async_training`` allows (``sync``: not at all; ``one_step``: one batch; ``bounded``: within
``max_staleness`` versions, ``wait`` or ``drop``). The trainer takes its batches from there
(:meth:`AsyncRollout.next_batch`) and, after each actor update, pushes the new weights to the rollout
workers (:meth:`AsyncRollout.after_update`; every ``trigger_parameter_sync_step`` updates), which
take them between generations, or in the middle of one with ``partial_rollout``. On Ray the weights
travel through the object store (nodes need no shared filesystem); locally the rollout is a child
process that gets a handle over a socket: to a CUDA buffer on the same GPU (CUDA IPC) or to a
shared-memory segment (:mod:`~rlvr.trainer.async_schedule.weight_push`). A push runs in the
background: the trainer goes on once the weights are copied and the call is on its way, and waits
for the rollout's reply before the next push, a generation of the rollouter, a validation, a
checkpoint and the end (``async/weight_push_s``: the trainer's blocking time;
``async/weight_push_confirm_s``: until the rollout confirmed).

Off-policy correction, by default when samples can be stale (``compute_prox_log_prob``): decoupled
PPO (Hilton et al. 2022, arXiv:2110.00641; AReaL, Fu et al. 2025, arXiv:2505.24298): the engine's
log-probs are the behaviour policy, the actor recomputes the proximal policy's (``old_log_probs``),
the PPO ratio is taken against the proximal policy and ``algorithm.rollout_correction`` weighs the
proximal/behaviour ratio (truncated IS at ``rollout_is_threshold``, token level, unless the run
sets its own correction). When the update is one optimizer step over the batch, the proximal policy
is the actor's weights at its start, and the update's own forward pass gives the proximal log-probs
(``prox_log_prob_from_update``; the separate actor pass is skipped). Without it (``compute_prox_log_prob=false``) the engine's log-probs are the
old ones, as in verl's fully-async default.

Faults: the rollout worker group is a stateless group of the trainer's recovery
(:class:`~rlvr.trainer.recovery.RestartableGroup`): a dead or hung rollout worker is restarted alone,
gets the last weights pushed, and the interrupted generation runs again; training does not roll
back. A failure it cannot cure reaches the trainer at its next wait for samples. Every wait has a
deadline: ``async_training.queue_timeout_s`` for samples, ``weight_sync_timeout_s`` per push.
"""

from __future__ import annotations

import copy
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from omegaconf import DictConfig

from rlvr.protocol import DataProto
from rlvr.trainer.async_schedule.buffer import SampleBuffer
from rlvr.trainer.async_schedule.placement import local_rollout_device
from rlvr.trainer.async_schedule.prompts import PromptSource
from rlvr.trainer.async_schedule.versions import check_staleness_bound, sample_staleness, staleness_metrics
from rlvr.trainer.async_schedule.weight_push import WAIT_MARGIN_S, BackgroundPush, WeightPacker
from rlvr.trainer.config.async_checks import decoupled_ppo, prox_from_update_blockers, staleness_bound
from rlvr.utils import core_lending
from rlvr.utils.core_lending import ROLLOUT, TRAINER, CoreLending
from rlvr.workers.worker_utils import cpu_thread_share, cpu_workers

__all__ = ["AsyncRollout", "decoupled_ppo", "prox_log_prob_from_update", "rollout_correction_config"]

STOP_WAIT_S = 60.0
"""How long a stopping schedule waits for its rollout thread (it ends once its generation call
returns or fails: the workers are shut down next)."""


def prox_log_prob_from_update(cfg: DictConfig, reads_old_log_prob: bool = False) -> bool:
    """Whether decoupled PPO takes the proximal log-probs from the update's own forward pass
    (``prox_log_prob_from_update``; None = whenever that is exact, see
    :func:`~rlvr.trainer.config.async_checks.prox_from_update_blockers`)."""
    choice = cfg.async_training.prox_log_prob_from_update
    if not decoupled_ppo(cfg) or choice is False:
        return False
    return not prox_from_update_blockers(cfg, reads_old_log_prob)


def rollout_correction_config(cfg: DictConfig) -> DictConfig:
    """``algorithm.rollout_correction`` as the run applies it: with decoupled PPO and no correction
    of its own, token-level truncated IS of the proximal/behaviour ratio."""
    rc = cfg.algorithm.rollout_correction
    if not decoupled_ppo(cfg) or rc.rollout_is is not None or rc.rollout_rs is not None:
        return rc
    corrected = copy.deepcopy(rc)
    corrected.rollout_is = "token"
    return corrected


class AsyncRollout:
    """The rollouter thread, the sample buffer, the prompts in flight and the weight pushes.

    Args:
        config: the run config.
        train_iter: the trainer's data iterator (the rollouter draws from it, ahead of training).
        generate: generates a batch of repeated prompts on the rollout workers (the trainer's
            ``_generate``); called from the rollouter thread.
        rollout_group: returns the rollout worker group (a ``RestartableGroup``).
        actor_weights: ``actor_weights(on_device)`` returns the actor's full weights (the trainer's
            actor group): on the actor's device when ``on_device`` (for CUDA IPC), else on the CPU.
        rollout_name: the rollout worker group's name, for messages.
    """

    def __init__(self, config: DictConfig, train_iter: Any, generate: Callable[[DataProto], DataProto],
                 rollout_group: Callable[[], Any], actor_weights: Callable[[bool], dict], rollout_name: str) -> None:
        a = config.async_training
        self.n = int(config.actor_rollout_ref.rollout.n)
        self.bound = staleness_bound(config)
        self.batch_size = int(config.data.train_batch_size)
        self.trigger = int(a.trigger_parameter_sync_step)
        self.queue_timeout_s, self.push_timeout_s = float(a.queue_timeout_s), float(a.weight_sync_timeout_s)
        self.old_from_rollout = a.compute_prox_log_prob is False  # no decoupling: the behaviour policy is the old one
        self.on_ray = config.trainer.backend == "ray"
        self.prompts = PromptSource(train_iter)
        self.buffer = SampleBuffer(self.batch_size, self.bound, a.staleness_policy == "drop", rollout_name)
        self._generate, self._rollout_group, self._actor_weights = generate, rollout_group, actor_weights
        self._weights: tuple[Any, int] | None = None  # the last push: (weights, their object ref or handle; version)
        self._packer = WeightPacker(self.on_ray, local_rollout_device(config))
        self._push = BackgroundPush(self.push_timeout_s, rollout_name)
        self._gen_metrics: list[dict] = []
        self._metrics_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.last_push_s = 0.0  # the trainer's blocking time in the last push
        self.lending = self._lend_idle_cores(config)

    @staticmethod
    def _lend_idle_cores(config: DictConfig) -> CoreLending | None:
        """With ``lend_idle_cores`` on a CPU (the config checks ensure the local backend and no fixed
        thread count): the shared waiting flags, installed for the trainer's side, their file named
        to the rollout child in the environment it inherits (:mod:`rlvr.utils.core_lending`)."""
        if not config.async_training.lend_idle_cores or config.trainer.device == "cuda" or (
                config.trainer.device == "auto" and torch.cuda.is_available()):
            return None
        own = cpu_thread_share(None, cpu_workers(config))  # the split a worker makes (num_threads is unset)
        lending = CoreLending.create(own, len(os.sched_getaffinity(0)))
        lending.set_waiting(ROLLOUT, True)  # nothing generated yet
        core_lending.install(lending)
        os.environ[core_lending.ENV_VAR] = f"{lending.path}:{os.getpid()}"
        return lending

    # ------------------------------------------------------------------ lifecycle
    @contextmanager
    def running(self) -> Iterator[None]:
        """The rollouter runs while the block does (one attempt of the trainer's loop)."""
        self.start()
        try:
            yield
            self._push.wait("the end of the run")
        finally:
            self.stop()

    def start(self) -> None:
        """Send the actor's current weights to the rollout and start the rollouter thread."""
        self._join_previous()
        if not self._push.discard(self.push_timeout_s + WAIT_MARGIN_S):  # a push of the failed attempt
            raise RuntimeError(f"the weight push of the previous attempt did not end within "
                               f"{self.push_timeout_s + WAIT_MARGIN_S:.0f} s after its workers were shut down; cannot "
                               "push again safely")
        self.buffer.reset(self.buffer.version)
        self.push_weights(self.buffer.version)
        self.buffer.weights_sent()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(self._stop,), daemon=True, name="rlvr-rollouter")
        self._thread.start()

    def stop(self) -> None:
        """Stop drawing and generating; a generation in flight is left to the workers' shutdown."""
        self._stop.set()
        self.buffer.stop()
        if self._thread is not None:
            self._thread.join(timeout=1.0)

    def close(self) -> None:
        """Release the buffers of the weight pushes, after the push in flight (the end of the run; a
        later push would make new ones) and the core-lending flags."""
        self._push.discard(self.push_timeout_s + WAIT_MARGIN_S)
        self._packer.close()
        if self.lending is not None:
            core_lending.install(None)
            os.environ.pop(core_lending.ENV_VAR, None)
            self.lending.close()
            self.lending = None

    def _join_previous(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout=STOP_WAIT_S)
            if self._thread.is_alive():
                raise RuntimeError(f"the rollout thread of the previous attempt did not stop within {STOP_WAIT_S:.0f} s "
                                   "after its workers were shut down; cannot start the rollout again safely")

    # ------------------------------------------------------------------ rollout side (its own thread)
    def _loop(self, stop: threading.Event) -> None:
        """Draw, generate and buffer batches as long as the admission rule allows."""
        try:
            while self._rollout_waits(self.buffer.wait_for_admission):
                self._push.wait("a generation")  # the rollout holds the weights last pushed
                prompts = self.prompts.take(self.batch_size)
                start = time.perf_counter()
                output = self._generate(prompts.repeat(self.n, interleave=True))
                if stop.is_set():
                    return  # a new attempt owns the prompts and the buffer now
                with self._metrics_lock:
                    self._gen_metrics.append({**output.meta_info.pop("metrics", {}),
                                              "async/rollout_gen_s": time.perf_counter() - start})
                groups = [output.select_idxs(list(range(i * self.n, (i + 1) * self.n))) for i in range(len(prompts))]
                oldest = [int(self.buffer.version - sample_staleness(g.batch["response_versions"],
                                                                   g.batch["response_mask"], self.buffer.version).max())
                          for g in groups]
                self.prompts.generated([g.non_tensor_batch["uid"][0] for g in groups], oldest)
                self.buffer.put(groups)
        except BaseException as err:  # noqa: BLE001 - handed to the trainer, which raises it at its next wait
            if not stop.is_set():
                self.buffer.fail(err)

    def _rollout_waits(self, wait: Callable[[], bool]) -> bool:
        """``wait()`` with the rollout marked waiting (its cores lent to the trainer) meanwhile; it
        stays marked when the rollout stops."""
        lending = self.lending
        if lending is None:
            return wait()
        lending.set_waiting(ROLLOUT, True)
        admitted = wait()
        lending.set_waiting(ROLLOUT, not admitted)
        return admitted

    @contextmanager
    def trainer_waiting(self) -> Iterator[None]:
        """The trainer waits on the rollout during the block (for samples, for a validation's
        generations): with ``lend_idle_cores`` its cores are lent to the rollout meanwhile."""
        lending = self.lending
        if lending is None:
            yield
            return
        lending.set_waiting(TRAINER, True)
        try:
            yield
        finally:
            lending.set_waiting(TRAINER, False)

    # ------------------------------------------------------------------ trainer side
    def next_batch(self) -> DataProto:
        """The next ``train_batch_size`` prompt groups (``rollout.n`` samples each), within the
        staleness bound, with the async metrics in ``meta_info["metrics"]`` and the policy version
        in ``meta_info["policy_version"]`` (the actor reuses exact log-probs of the current version)."""
        with self.trainer_waiting():
            groups, _ = self.buffer.take(self.queue_timeout_s, self.prompts.requeue)
        batch = DataProto.concat(groups)
        self.prompts.trained([g.non_tensor_batch["uid"][0] for g in groups])
        version = self.buffer.version
        versions, mask = batch.batch["response_versions"], batch.batch["response_mask"]
        check_staleness_bound(versions, mask, version, self.bound)
        with self._metrics_lock:
            gen_metrics, self._gen_metrics = self._gen_metrics, []
        metrics: dict[str, Any] = {}
        for part in gen_metrics:
            for name, value in part.items():
                metrics.setdefault(name, []).extend(value if isinstance(value, list) else [value])
        metrics.update(staleness_metrics(versions, mask, version, self.bound))
        metrics.update(self.buffer.take_counters())
        metrics.update({"async/weight_push_s": self.last_push_s, "async/policy_version": float(version),
                        "async/weight_push_confirm_s": self._push.last_confirm_s})
        if self.lending is not None:
            metrics.update(self.lending.take_lent_share("trainer"))
        batch.meta_info.update(metrics=metrics, policy_version=version)
        if self.old_from_rollout:
            batch.meta_info["old_log_probs_from_rollout"] = True
        return batch

    def after_update(self) -> None:
        """The actor made an update: push the new weights when due, then let the rollout go on."""
        version = self.buffer.version + 1
        due = version % self.trigger == 0
        if due:
            self.push_weights(version)
        self.buffer.updated(pushed=due)

    def sync_weights(self) -> None:
        """Make sure the rollout holds the trainer's current weights (before a validation)."""
        if self.buffer.pushed != self.buffer.version:
            self.push_weights(self.buffer.version)
            self.buffer.weights_sent()
        self._push.wait("a validation")

    def push_weights(self, version: int) -> None:
        """Send the actor's weights to every rollout worker as ``version``, in the background: it
        returns once they are copied into the push's buffer (on a GPU: the copies enqueued) and the
        call is on its way (timed: ``async/weight_push_s``; the confirmation:
        ``async/weight_push_confirm_s``). The previous push is waited for first: its buffer is
        written again here.

        Raises:
            WorkerTimeoutError: a rollout worker took the previous push not within ``weight_sync_timeout_s``.
        """
        start = time.perf_counter()
        self._push.wait("the next weight push")
        weights = self._packer.pack(self._actor_weights(self._packer.wants_device_weights))
        self._weights = (weights, version)
        group = self._rollout_group()
        self._push.start(lambda: self.resend_weights(group), version, start)
        self.last_push_s = time.perf_counter() - start

    def resend_weights(self, group: Any) -> None:
        """Give ``group`` (a rollout group, e.g. one just restarted) the last weights pushed."""
        if self._weights is not None:
            group.update_weights(*self._weights, _timeout_s=self.push_timeout_s)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The data position, the unfinished prompts and the policy version (see :class:`PromptSource`);
        a checkpoint: the push in flight is confirmed first."""
        self._push.wait("a checkpoint")
        return {**self.prompts.state_dict(), "policy_version": self.buffer.version}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`: the unfinished prompts are generated again first."""
        self.prompts.load_state_dict(state)
        self.buffer.reset(int(state["policy_version"]))
