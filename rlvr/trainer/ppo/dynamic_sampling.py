"""DAPO dynamic sampling (Yu et al. 2025, "DAPO", arXiv:2503.14476, section 3.2).

A group (the ``rollout.n`` samples of one prompt, sharing a ``uid``) whose metric is the same for
every sample has zero group-relative advantage and teaches nothing; such groups are dropped and
more prompts are generated until the batch holds ``train_batch_size`` informative groups.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from rlvr.protocol import DataProto


SCORE_METRICS = ("score", "reward", "seq_reward")
"""verl's names of the sample's score (the reward before any KL penalty): ``reward`` (0.9),
``seq_reward`` (its DAPO recipe), rlvr's ``score``."""


def group_metric(batch: DataProto, metric: str) -> np.ndarray:
    """The per-sample value compared within a group, ``[batch]``: ``acc`` (0/1 correctness) or
    the score (sum of ``token_level_scores``: ``score``, or verl's ``reward`` / ``seq_reward``)."""
    if metric == "acc":
        return np.asarray(batch.non_tensor_batch["acc"], dtype=np.float64)
    if metric in SCORE_METRICS:
        return batch.batch["token_level_scores"].sum(-1).double().cpu().numpy()
    raise ValueError(f"unknown filter_groups metric {metric!r}; use 'acc' or one of {SCORE_METRICS}")


def informative_groups(uids: np.ndarray, values: np.ndarray) -> list[str]:
    """uids (in order of first appearance) whose samples do not all share one value; a group of
    one sample is never informative."""
    groups: OrderedDict[str, list[float]] = OrderedDict()
    for uid, value in zip(uids, values):
        groups.setdefault(str(uid), []).append(float(value))
    return [uid for uid, vals in groups.items() if len(vals) > 1 and max(vals) > min(vals)]


def select_groups(batch: DataProto, uids: list[str]) -> DataProto:
    """The rows of ``batch`` whose uid is in ``uids`` (original row order kept)."""
    wanted = set(uids)
    rows = [i for i, uid in enumerate(batch.non_tensor_batch["uid"]) if str(uid) in wanted]
    return batch.select_idxs(np.asarray(rows, dtype=np.int64))


class GroupAccumulator:
    """Collects informative groups over several generation batches.

    Args:
        metric: ``acc`` or ``score`` (see :func:`group_metric`).
    """

    def __init__(self, metric: str) -> None:
        self.metric = metric
        self.parts: list[DataProto] = []
        self.num_groups = 0
        self.num_seen_groups = 0
        self.seen_scores: list[float] = []
        self.seen_acc: list[float] = []

    def add(self, batch: DataProto) -> None:
        """Keep the informative groups of ``batch`` (and remember every sample's score and acc)."""
        uids = batch.non_tensor_batch["uid"]
        self.seen_scores += group_metric(batch, "score").tolist()
        self.seen_acc += group_metric(batch, "acc").tolist()
        keep = informative_groups(uids, group_metric(batch, self.metric))
        self.num_seen_groups += len(set(map(str, uids)))
        if keep:
            self.parts.append(select_groups(batch, keep))
            self.num_groups += len(keep)

    def take(self, num_groups: int, group_size: int) -> DataProto | None:
        """The first ``num_groups`` kept groups (``num_groups * group_size`` rows), or None if none."""
        if not self.parts:
            return None
        batch = self.parts[0] if len(self.parts) == 1 else DataProto.concat(self.parts)
        return batch.slice(0, num_groups * group_size)
