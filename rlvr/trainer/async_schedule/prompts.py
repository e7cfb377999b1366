"""The prompts of an asynchronous run: drawn ahead of training, and none lost or trained twice.

The rollout draws its prompts from the trainer's data iterator before the trainer needs them, so at
any moment some prompts are *unfinished*: generating (in flight) or generated and waiting in the
sample buffer. :class:`PromptSource` keeps them, in the order they were drawn, until the trainer
trains on them; a group dropped for staleness goes back to the front of the queue and is generated
again. A checkpoint records the data position and the unfinished prompts (with the version each
buffered group was generated with), taken together under one lock, so a resumed run generates
exactly those prompts again first and then goes on from the data position: every prompt of an
epoch is trained once, whatever was in flight when the run stopped.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from rlvr.protocol import DataProto

__all__ = ["PromptSource"]


class PromptSource:
    """Prompt rows for the rollout, with the unfinished ones kept for checkpoints.

    Args:
        batches: the trainer's data iterator (``StatefulBatchIterator``: collated batches, with
            ``state_dict`` / ``load_state_dict``).

    Each row gets a ``uid`` (``"p<k>"``, counting every prompt the run drew) that names its group.
    """

    def __init__(self, batches: Iterator[dict[str, Any]]) -> None:
        self.batches = batches
        self._lock = threading.Lock()
        self._queue: list[DataProto] = []  # drawn rows not taken yet (one row each; requeued ones first)
        self._unfinished: dict[str, tuple[DataProto, int | None]] = {}  # in flight or buffered: uid -> (row, version)
        self._drawn = 0

    def take(self, count: int) -> DataProto:
        """The next ``count`` prompt rows (requeued ones first), now in flight."""
        with self._lock:
            while len(self._queue) < count:
                batch = DataProto.from_single_dict(next(self.batches))
                batch.non_tensor_batch["uid"] = np.array([f"p{self._drawn + i}" for i in range(len(batch))],
                                                         dtype=object)
                self._drawn += len(batch)
                self._queue += [batch.select_idxs([i]) for i in range(len(batch))]
            rows, self._queue = self._queue[:count], self._queue[count:]
            for row in rows:
                self._unfinished[row.non_tensor_batch["uid"][0]] = (row, None)
            return DataProto.concat(rows)

    def generated(self, uids: list[str], versions: list[int]) -> None:
        """The groups of ``uids`` are in the buffer, generated with weights ``versions`` (oldest token)."""
        with self._lock:
            for uid, version in zip(uids, versions):
                self._unfinished[uid] = (self._unfinished[uid][0], int(version))

    def requeue(self, uids: list[str]) -> None:
        """Generate the prompts of ``uids`` again, before any other (their groups were dropped)."""
        with self._lock:
            self._queue = [self._unfinished.pop(uid)[0] for uid in uids] + self._queue

    def trained(self, uids: list[str]) -> None:
        """The groups of ``uids`` were handed to training: their prompts are finished."""
        with self._lock:
            for uid in uids:
                del self._unfinished[uid]

    def state_dict(self) -> dict[str, Any]:
        """The data position and the unfinished prompts, taken at one instant: those in flight or
        buffered (with the version each buffered one was generated with; None: not generated yet),
        then those queued (drawn with a batch but not taken yet, or requeued)."""
        with self._lock:
            return {"data": self.batches.state_dict(), "drawn": self._drawn,
                    "unfinished": [*self._unfinished.values(), *((row, None) for row in self._queue)]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`: the unfinished prompts are generated first, in order."""
        with self._lock:
            self.batches.load_state_dict(state["data"])
            self._drawn = int(state["drawn"])
            self._queue = [row for row, _ in state["unfinished"]]
            self._unfinished = {}

    def unfinished_uids(self) -> list[str]:
        """The uids of every prompt drawn and not trained yet."""
        with self._lock:
            return [*self._unfinished, *(row.non_tensor_batch["uid"][0] for row in self._queue)]
