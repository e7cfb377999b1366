"""The sample buffer between the rollout and the trainer, and the admission rule that keeps every
trained sample within the staleness bound.

The rollout generates batches of ``B`` prompt groups (``data.train_batch_size``) and puts them here;
the trainer takes ``B`` groups per generation batch of a step. Versions count actor updates: the
trainer at version ``v`` has made ``v`` updates, the rollout generates with the last weights pushed
to it (``pushed``; ``async_training.trigger_parameter_sync_step`` pushes every k updates).

**wait** (``staleness_policy=wait``; ``sync`` is ``max_staleness=0``, ``one_step`` is 1): the rollout
starts a batch only when no sample of it can exceed the bound ``S``. Between two takes the trainer
makes at most one update, and none while it waits for samples. A new batch queues behind ``ahead``
groups (buffered or in flight, a multiple of ``B``), so its last group is taken ``ahead / B`` takes
later, and at most ``ahead / B + busy`` updates (``busy``: the trainer is not waiting) happen
between its start and its take; its oldest tokens are ``v - pushed`` versions old at the start. So:

    admit  <=>  (v - pushed) + ahead / B + busy <= S

With ``S = 0`` a batch starts only when the trainer waits for it with the newest weights: the
synchronous trainer. With ``S = 1`` one batch is generated while the trainer trains on the
previous one. The rule never blocks a waiting trainer for good: with nothing buffered or in flight
and the newest weights pushed, it admits.

**drop**: the rollout keeps ``(S + 1) * B`` groups buffered or in flight at most, without looking at
versions; when the trainer takes groups, those over the bound (from their per-token versions) are
dropped and their prompts generated again (``async/dropped_samples``).

Every wait has a deadline: the trainer's raises naming the stage and the rollout worker group.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from rlvr.protocol import DataProto
from rlvr.trainer.async_schedule.versions import sample_staleness
from rlvr.utils.errors import WorkerTimeoutError

__all__ = ["SampleBuffer"]


class SampleBuffer:
    """Generated groups waiting for the trainer, and the version counters of the schedule.

    Args:
        batch_size: ``B``, prompt groups per generation batch (and per take).
        bound: ``S``, the staleness bound.
        drop: ``staleness_policy=drop`` (else wait).
        rollout_name: the rollout worker group's name, for error messages.
    """

    def __init__(self, batch_size: int, bound: int, drop: bool, rollout_name: str) -> None:
        self.batch_size, self.bound, self.drop, self.rollout_name = batch_size, bound, drop, rollout_name
        self._cond = threading.Condition()
        self._groups: deque[DataProto] = deque()
        self.in_flight = 0  # groups being generated
        self.version = 0  # the trainer's policy version (actor updates so far)
        self.pushed = 0  # the version of the weights the rollout holds (or has been sent)
        self.trainer_waiting = False
        self._failure: BaseException | None = None
        self.stopping = False
        self.counters = {"dropped_samples": 0.0, "trainer_wait_s": 0.0, "rollout_wait_s": 0.0}

    # ------------------------------------------------------------------ rollout side
    def admitted(self) -> bool:
        """Whether a new generation batch may start now (see the module docstring)."""
        ahead = len(self._groups) + self.in_flight
        if self.drop:
            return ahead + self.batch_size <= (self.bound + 1) * self.batch_size or (
                self.trainer_waiting and ahead < self.batch_size)
        busy = 0 if self.trainer_waiting else 1
        return (self.version - self.pushed) + ahead // self.batch_size + busy <= self.bound

    def wait_for_admission(self) -> bool:
        """Block until a new batch may start (then count it in flight: ``B`` groups); False when
        the schedule is stopping."""
        start = time.perf_counter()
        with self._cond:
            while not (self.stopping or self.admitted()):
                self._cond.wait(timeout=1.0)
            self.counters["rollout_wait_s"] += time.perf_counter() - start
            if self.stopping:
                return False
            self.in_flight += self.batch_size
            return True

    def put(self, groups: list[DataProto]) -> None:
        """The groups of one generation batch (``B`` of them, one per prompt)."""
        with self._cond:
            self._groups.extend(groups)
            self.in_flight -= len(groups)
            self._cond.notify_all()

    def fail(self, error: BaseException) -> None:
        """The rollout stopped on ``error``; the trainer's next wait raises it."""
        with self._cond:
            self._failure = error
            self._cond.notify_all()

    # ------------------------------------------------------------------ trainer side
    def take(self, timeout_s: float, requeue: Callable[[list[str]], None]) -> tuple[list[DataProto], int]:
        """The next ``B`` groups within the bound, waiting for them; returns them and the number of
        groups dropped meanwhile (their prompts handed to ``requeue`` by uid).

        Raises:
            the rollout's failure, if it stopped on one;
            WorkerTimeoutError: no ``B`` groups within ``timeout_s`` (names the rollout group).
        """
        deadline = time.monotonic() + timeout_s
        start = time.perf_counter()
        taken: list[DataProto] = []
        dropped = 0
        with self._cond:
            self.trainer_waiting = True
            self._cond.notify_all()
            try:
                while len(taken) < self.batch_size:
                    if self._failure is not None:
                        raise self._failure
                    if self._groups:
                        group = self._groups.popleft()
                        if self.drop and self._too_old(group):
                            requeue(list(group.non_tensor_batch["uid"][:1]))
                            dropped += 1
                            self._cond.notify_all()
                        else:
                            taken.append(group)
                        continue
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise WorkerTimeoutError(
                            self.rollout_name, "generate_sequences", 0,
                            f"the trainer waited {timeout_s:.0f} s for generated samples (stage 'gen' of an "
                            f"asynchronous run) and got {len(taken)} of {self.batch_size} prompt groups; "
                            f"{self.in_flight} groups are being generated. Raise async_training.queue_timeout_s "
                            "if generation is that slow, else look for a stalled rollout worker")
                    self._cond.wait(timeout=min(left, 1.0))
            finally:
                self.trainer_waiting = False
                self.counters["trainer_wait_s"] += time.perf_counter() - start
                self.counters["dropped_samples"] += dropped * (len(taken[0]) if taken else 0)
        return taken, dropped

    def _too_old(self, group: DataProto) -> bool:
        staleness = sample_staleness(group.batch["response_versions"], group.batch["response_mask"], self.version)
        return bool((staleness > self.bound).any())

    def updated(self, pushed: bool) -> None:
        """The trainer made an update (``pushed``: and sent the new weights to the rollout)."""
        with self._cond:
            self.version += 1
            if pushed:
                self.pushed = self.version
            self._cond.notify_all()

    def weights_sent(self) -> None:
        """The rollout holds the trainer's current weights (a push outside an update)."""
        with self._cond:
            self.pushed = self.version
            self._cond.notify_all()

    def take_counters(self) -> dict[str, float]:
        """``async/<counter>`` since the last call: dropped samples, trainer and rollout wait seconds."""
        with self._cond:
            out = {f"async/{name}": value for name, value in self.counters.items()}
            self.counters = dict.fromkeys(self.counters, 0.0)
        return out

    def stop(self) -> None:
        """Release every wait (the rollout thread ends)."""
        with self._cond:
            self.stopping = True
            self._cond.notify_all()

    def reset(self, version: int) -> None:
        """Empty the buffer for a (re)start at policy ``version`` (its prompts are requeued by the
        caller from the checkpoint)."""
        with self._cond:
            self._groups.clear()
            self.in_flight = 0
            self.version = self.pushed = version
            self._failure = None
            self.stopping = False
            self.trainer_waiting = False
