"""Weights that arrive while a rollout worker generates, and partial rollouts.

A rollout worker that runs apart from the actor (``actor_rollout_ref.hybrid_engine=false``) gets new
weights from the trainer while it may be generating (its worker group runs two calls at once: a
generation and a weight push). :class:`WeightInbox` keeps such weights until the engine can take
them and never loads them in the middle of a decode step:

- without partial rollouts they wait for the end of the running generation (the next one starts
  with them); weights that arrive while the engine is idle are loaded at once;
- with ``async_training.partial_rollout`` (an engine whose factory says ``interruptible``) they
  set the engine's interrupt: it stops after its current decode step, and :class:`PartialRollout`
  loads the new weights and continues every cut row from where it stopped: the prompt plus the
  tokens sampled so far become the new prompt, the rest of the row's budget the response length.
  Tokens sampled before the update keep their log-probs and their version (``response_versions``),
  the later ones carry the new version.

The agent loops see :class:`PartialRollout` as the engine, so a multi-turn rollout continues each
round the same way. A stop string split by the interruption (its first characters sampled before,
its last after) is not recognised: the row then runs on to EOS or its budget.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from rlvr.protocol import DataProto
from rlvr.utils.torch_functional import compute_position_ids, left_pad
from rlvr.workers.rollout.base import RolloutEngine, Weights, response_tensors
from rlvr.workers.rollout.shared_weights import WeightsHandle

__all__ = ["WeightInbox", "PartialRollout"]

_SAMPLED_KEYS = ("responses", "response_mask", "rollout_log_probs", "response_versions")


class WeightInbox:
    """Where a rollout engine's new weights wait until the engine can load them (module docstring).

    Args:
        engine: the rollout engine.
        partial_rollout: weights that arrive during a generation interrupt it (the engine must be
            interruptible), instead of waiting for its end.

    Attributes:
        last_interrupted_rows: rows of the last generation that a weight update cut and that were
            continued with the new weights.
    """

    def __init__(self, engine: RolloutEngine, partial_rollout: bool) -> None:
        self.engine = engine
        self.interrupt = threading.Event() if partial_rollout else None
        self._lock = threading.Lock()  # held while weights load, so two loads never overlap
        self._generation_lock = threading.Lock()  # one generation at a time (training and validation)
        self._pending: tuple[Weights, int] | None = None
        self._generating = False
        self.last_interrupted_rows = 0

    def deliver(self, weights: Weights | WeightsHandle, version: int) -> dict[str, float]:
        """Take weights ``version``: loaded now when the engine is idle, else kept for later (a
        newer delivery replaces an older one that is still waiting) and, with partial rollouts,
        the running generation is interrupted. Weights behind a handle (shared memory, CUDA IPC)
        are read during this call (kept for later: copied out first; the trainer overwrites its
        buffer at its next push). Returns the engine's seconds per sync stage when the weights
        loaded now, else ``{}``."""
        handle = isinstance(weights, WeightsHandle)
        with self._lock:
            if not self._generating:
                if handle:
                    with weights.tensors() as views:
                        return self._load(views, version)
                return self._load(weights, version)
            self._pending = (weights.copy() if handle else weights, version)
            if self.interrupt is not None:
                self.interrupt.set()
            return {}

    def _load(self, weights: Weights, version: int) -> dict[str, float]:
        self.engine.wake_up()
        return self.engine.update_weights(weights, version) or {}

    def load_pending(self) -> None:
        """Load the weights that are waiting, if any, and clear the interrupt (the generating
        thread calls this between engine calls)."""
        with self._lock:
            pending, self._pending = self._pending, None
            if self.interrupt is not None:
                self.interrupt.clear()
            if pending is not None:
                self._load(*pending)

    @contextmanager
    def generation(self, validate: bool, sleep_after: bool = False) -> Iterator[RolloutEngine]:
        """The engine for one ``generate_sequences`` of the worker, woken up and with the waiting
        weights loaded first: a :class:`PartialRollout` with partial rollouts (not for validation,
        which runs on one version), else the engine itself. Weights that arrived meanwhile are
        loaded at the end, then the engine sleeps if ``sleep_after`` (``rollout.free_cache_engine``).

        Waking and sleeping happen here, under the locks, because the worker runs two calls at once:
        a sleep outside them (an owned copy of the weights moved to CPU on GPU) could land in the
        middle of the next generation (a validation waiting for this one) or of a weight load."""
        with self._generation_lock:
            with self._lock:
                self._generating = True
            try:
                self.engine.wake_up()
                self.load_pending()
                self.last_interrupted_rows = 0
                if self.interrupt is None or validate:
                    yield self.engine
                else:
                    partial = PartialRollout(self.engine, self.interrupt, self.load_pending)
                    yield partial
                    self.last_interrupted_rows = partial.interrupted_rows
            finally:
                with self._lock:
                    self._generating = False
                self.load_pending()
                if sleep_after:
                    with self._lock:  # not in the middle of a weight load that arrives now
                        self.engine.sleep()


class PartialRollout:
    """The engine as the agent loops see it while weights may change mid-generation (module docstring).

    Args:
        engine: an interruptible rollout engine.
        interrupt: the event that asks the engine to stop (set by :meth:`WeightInbox.deliver`).
        resume: loads the waiting weights and clears ``interrupt``.

    Attributes:
        interrupted_rows: rows cut by a weight update and continued, over every call (a row cut
            twice counts twice).
    """

    def __init__(self, engine: RolloutEngine, interrupt: threading.Event, resume: Callable[[], None]) -> None:
        self.engine = engine
        self.interrupt = interrupt
        self.resume = resume
        self.interrupted_rows = 0

    @property
    def weights_version(self) -> int:
        return self.engine.weights_version

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """The engine's output for ``prompts``, every row finished (see :mod:`rlvr.workers.rollout.base`)."""
        if self.interrupt.is_set():
            self.resume()
        call_meta = {key: value for key, value in prompts.meta_info.items() if key != "n"}
        output = self._call(prompts)
        cut = output.meta_info.pop("interrupted_rows")
        while cut:
            self.interrupted_rows += len(cut)
            self.resume()
            cut = self._continue(output, cut, call_meta)
        return output

    def _call(self, prompts: DataProto) -> DataProto:
        request = prompts.select()
        request.meta_info = {**prompts.meta_info, "interrupt": self.interrupt}
        return self.engine.generate_sequences(request)

    def _continue(self, output: DataProto, rows: list[int], call_meta: dict) -> list[int]:
        """Generate the rest of the cut ``rows`` of ``output`` (in place); returns the rows cut again.

        Each row's context is its prompt and the tokens sampled so far ``[n_i]``; the call asks for
        the largest remaining budget ``R - n_i`` and each row keeps at most its own.
        """
        tensors = output.batch
        width = tensors["responses"].shape[1]
        prompt_width = tensors["prompts"].shape[1]
        done = tensors["response_mask"][rows].sum(-1).tolist()
        contexts = []
        for row, n in zip(rows, done):
            prompt = tensors["prompts"][row][tensors["attention_mask"][row, :prompt_width].bool()]
            contexts.append(torch.cat([prompt, tensors["responses"][row, :n]]).tolist())
        ids, mask = left_pad(contexts, max(len(c) for c in contexts), 0)  # the mask hides the padding id
        request = DataProto.from_dict(tensors={"input_ids": ids, "attention_mask": mask,
                                               "position_ids": compute_position_ids(mask)})
        request.meta_info = {**call_meta, "response_length": max(width - n for n in done)}
        more = self._call(request)
        added = more.batch["response_mask"].sum(-1).tolist()
        sampled = {key: tensors[key].clone() for key in _SAMPLED_KEYS}
        for j, (row, n) in enumerate(zip(rows, done)):
            keep = min(int(added[j]), width - n)
            for key in _SAMPLED_KEYS:
                sampled[key][row, n:n + keep] = more.batch[key][j, :keep]
        prompt_keys = (tensors["prompts"], tensors["attention_mask"][:, :prompt_width],
                       tensors["position_ids"][:, :prompt_width])
        rebuilt = response_tensors(*prompt_keys, sampled["responses"], sampled["response_mask"],
                                   sampled["rollout_log_probs"], sampled["response_versions"])
        for key, value in rebuilt.items():
            tensors[key] = value
        output.meta_info["rollout_weights_version"] = more.meta_info["rollout_weights_version"]
        return [rows[j] for j in more.meta_info["interrupted_rows"]]

