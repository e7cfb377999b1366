"""``trainer.balance_batch``: reorder a step's batch so that every data-parallel rank gets about the
same number of tokens, without changing any update.

Where the rows go: the data-parallel dispatch hands rank ``r`` of ``D`` the contiguous chunk
``[r C, (r + 1) C)`` of the batch (``C = rows / D``), and the PPO update of that rank cuts its chunk
into mini-batches of ``m = ppo_mini_batch_size x rollout.n / D`` rows; global mini-batch ``k`` (one
optimizer step) is block ``k`` of every rank. A mini-batch's loss is aggregated over all its rows on
all ranks (:func:`rlvr.workers.ppo_update.loss_share`), so it depends on which rows the mini-batch
holds, not on which rank holds them.

The balancer therefore moves a row only to a position of the same global mini-batch, of the actor's
update and of the critic's when the critic cuts the batch differently (the positions that agree on
both are a *class*), and inside each class splits the rows over the ranks with balanced token counts
(prompt + response, ``attention_mask``): the Karmarkar-Karp differencing method with equal part sizes
(:func:`rlvr.workers.batching.balanced_partitions`), or, when the ranks hold unequal shares of a class
(a critic on another layout), the largest row first onto the rank with the fewest tokens that still
has room. Each class starts from the ranks' running totals, so every optimizer step and the whole
step are balanced; a batch whose fullest rank would not get fewer tokens is left as it came. With ``actor.shuffle=false`` (the default) every optimizer step sees the same rows
as without balancing, so the loss and the update agree up to the order of float sums; verl's own
default instead re-cuts the mini-batches (its ``keep_minibatch=False``), which changes the update.

A prompt's group (its ``rollout.n`` rows, one ``uid``) is moved as one unit when the advantage
estimator's registry entry says it needs groups (``needs_groups``: GRPO, RLOO, ...), so the group stays
on one rank and its prompt is run once there (``actor.share_prompt_forward``); that is possible when
every group lies inside one class and the groups of a class fit the ranks' shares of it evenly,
otherwise rows move one by one (``global_seqlen/groups_kept`` = 0).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from rlvr.protocol import DataProto
from rlvr.workers.batching import balanced_partitions
from rlvr.workers.megatron.layout import data_parallel_size

__all__ = ["UpdateLayout", "balance_batch", "balanced_order", "update_layouts"]


@dataclass(frozen=True)
class UpdateLayout:
    """How one role's dispatch and PPO update cut a batch: ``dp_size`` ranks, each taking
    ``mini_batch_rows`` of its rows per optimizer step."""

    dp_size: int
    mini_batch_rows: int

    def cells(self, rows: int) -> tuple[np.ndarray, np.ndarray]:
        """``(rank [rows], mini-batch [rows])`` of every position of a batch of ``rows`` rows."""
        if rows % self.dp_size:
            raise ValueError(f"a batch of {rows} rows does not split over {self.dp_size} data-parallel ranks; the "
                             "trainer trims every training batch to a multiple of the ranks")
        chunk, positions = rows // self.dp_size, np.arange(rows)
        return positions // chunk, (positions % chunk) // self.mini_batch_rows


def update_layouts(config, use_critic: bool) -> list[UpdateLayout]:
    """The actor's layout, then the critic's (``use_critic``), from the run config."""
    n = config.actor_rollout_ref.rollout.n
    sections = [("actor", config.actor_rollout_ref.actor)] + ([("critic", config.critic)] if use_critic else [])
    layouts = []
    for role, section in sections:
        dp = data_parallel_size(config, role)
        layouts.append(UpdateLayout(dp, section.ppo_mini_batch_size * n // dp))
    return layouts


def balanced_order(seq_lens: Sequence[int], layouts: Sequence[UpdateLayout],
                   groups: Sequence | None = None) -> tuple[list[int], bool]:
    """The balanced row order: new position ``i`` holds old row ``order[i]``.

    Args:
        seq_lens: ``[rows]`` tokens of each row, in the batch's current (dispatch) order.
        layouts: the roles' layouts; the first one's ranks are balanced, and every row keeps its
            mini-batch in each of them.
        groups: ``[rows]`` group id of each row (``uid``) to keep groups whole, or None.

    Returns:
        ``(order, groups_kept)``: ``groups_kept`` is False when ``groups`` were given but could not be
        kept whole (then rows were balanced one by one).
    """
    rows = len(seq_lens)
    rank, _ = layouts[0].cells(rows)
    minis = np.stack([layout.cells(rows)[1] for layout in layouts], axis=1)
    _, klass = np.unique(minis, axis=0, return_inverse=True)
    klass = klass.reshape(-1)
    dp = layouts[0].dp_size
    units = _group_units(klass, rank, dp, groups) if groups is not None else None
    groups_kept = units is not None or groups is None
    if units is None:
        units = [[[p] for p in np.flatnonzero(klass == c).tolist()] for c in range(int(klass.max()) + 1)]
    order = [0] * rows
    totals = [0] * dp
    for c, class_units in enumerate(units):
        positions = np.flatnonzero(klass == c)
        capacity = [int((rank[positions] == r).sum()) for r in range(dp)]
        for r, unit_ids in enumerate(_assign(class_units, capacity, seq_lens, totals)):
            moved = sorted(row for u in unit_ids for row in class_units[u])
            for position, row in zip(positions[rank[positions] == r].tolist(), moved, strict=True):
                order[position] = row
                totals[r] += seq_lens[row]
    if max(totals) >= max(_rank_tokens(seq_lens, range(rows), dp)):  # no better than the batch as it came
        return list(range(rows)), groups_kept
    return order, groups_kept


def _group_units(klass: np.ndarray, rank: np.ndarray, dp: int, groups: Sequence) -> list[list[list[int]]] | None:
    """Per class, its groups as lists of rows; None when a group spans classes, or a class's groups
    differ in size or do not fill every rank's share of the class in whole groups."""
    members: dict[object, list[int]] = {}
    for row, group in enumerate(groups):
        members.setdefault(group, []).append(row)
    units: list[list[list[int]]] = [[] for _ in range(int(klass.max()) + 1)]
    for rows in members.values():
        classes = {int(klass[row]) for row in rows}
        if len(classes) > 1:
            return None
        units[classes.pop()].append(rows)
    for c, class_units in enumerate(units):
        sizes = {len(unit) for unit in class_units}
        share = [int(((klass == c) & (rank == r)).sum()) for r in range(dp)]
        if len(sizes) != 1 or any(s % next(iter(sizes)) for s in share):
            return None
    return units


def _assign(units: list[list[int]], capacity: list[int], seq_lens: Sequence[int], totals: list[int]) -> list[list[int]]:
    """Unit indices per rank, each rank's rows filling its ``capacity``, balancing ``totals`` + the units'
    tokens. Units have one size (rows, or the groups of a class)."""
    dp, size = len(capacity), len(units[0])
    costs = [sum(seq_lens[row] for row in unit) for unit in units]
    if len(set(capacity)) == 1:  # every rank holds the same share: equal-size Karmarkar-Karp
        parts = balanced_partitions(costs, dp, equal_size=True)
        parts.sort(key=lambda part: -sum(costs[u] for u in part))
        ranks = sorted(range(dp), key=lambda r: (totals[r], r))
        assigned: list[list[int]] = [[] for _ in range(dp)]
        for r, part in zip(ranks, parts, strict=True):
            assigned[r] = part
        return assigned
    room = [c // size for c in capacity]
    load = list(totals)
    assigned = [[] for _ in range(dp)]
    for u in sorted(range(len(units)), key=lambda u: (-costs[u], u)):
        r = min((r for r in range(dp) if room[r] > 0), key=lambda r: (load[r], r))
        assigned[r].append(u)
        room[r] -= 1
        load[r] += costs[u]
    return assigned


def _rank_tokens(seq_lens: Sequence[int], order: Sequence[int], dp: int) -> list[int]:
    chunk = len(order) // dp
    return [sum(seq_lens[row] for row in order[r * chunk : (r + 1) * chunk]) for r in range(dp)]


def balance_batch(batch: DataProto, layouts: Sequence[UpdateLayout], keep_groups: bool,
                  prefix: str = "global_seqlen") -> dict[str, float]:
    """Reorder ``batch`` in place (:func:`balanced_order`; groups by ``uid`` when ``keep_groups``) and
    return verl's balance metrics: the tokens of the fullest and emptiest rank before (``min``,
    ``max``, ``minmax_diff``) and after (``balanced_min``, ``balanced_max``), the ``mean``, and
    ``groups_kept`` when ``keep_groups``."""
    seq_lens = batch.batch["attention_mask"].sum(-1).tolist()
    groups = batch.non_tensor_batch["uid"].tolist() if keep_groups else None
    order, kept = balanced_order(seq_lens, layouts, groups)
    dp = layouts[0].dp_size
    before, after = _rank_tokens(seq_lens, range(len(seq_lens)), dp), _rank_tokens(seq_lens, order, dp)
    batch.reorder(torch.tensor(order))
    metrics = {f"{prefix}/min": float(min(before)), f"{prefix}/max": float(max(before)),
               f"{prefix}/minmax_diff": float(max(before) - min(before)),
               f"{prefix}/balanced_min": float(min(after)), f"{prefix}/balanced_max": float(max(after)),
               f"{prefix}/mean": float(np.mean(before))}
    if keep_groups:
        metrics[f"{prefix}/groups_kept"] = float(kept)
    return metrics
