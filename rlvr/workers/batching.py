"""Splitting a worker's batch into micro-batches, and finding the rows that share a prompt.

A micro-batch is a list of row indices into the worker's local batch. Three ways to size them:

- by count: ``micro_batch_size`` rows each (the last one may be shorter);
- by token budget (``use_dynamic_bsz``), padded forward: rows sorted by length and packed so that a
  micro-batch's padded size ``rows x longest row`` stays within ``max_token_len``;
- by token budget, packed forward (``use_remove_padding``): a micro-batch costs the sum of its rows'
  lengths; the fewest micro-batches that keep within ``max_token_len`` are made, with their token
  counts balanced by the Karmarkar-Karp differencing method (:func:`packed_token_budget_partitions`).

Every rank of a data-parallel group must run the same number of forward passes (FSDP2 all-gathers
parameters in each one), so the count is raised to the largest count of any rank. Results are
written back by row index, so they come out in the batch's order whatever the micro-batches are.
:func:`balanced_partitions` with ``equal_size`` also splits a batch over data-parallel ranks with
balanced token counts (``trainer.balance_batch``).

How micro-batch losses add up to the mini-batch's gradient is :mod:`rlvr.workers.ppo_update`.

Rows that share a prompt (``rollout.n`` responses per prompt) are found by :func:`distinct_prompts`,
so that the prompt is run once (prefill in the rollout, shared forward in the actor) and micro-batches
keep a prompt's rows together (:func:`prompt_grouped_order`); the prompt's KV cache rows are then
copied out to its rows by :func:`rlvr.workers.kv_cache.select_cache_rows`.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence

import torch

from rlvr.workers.collectives import all_reduce_max

__all__ = [
    "balanced_partitions",
    "distinct_prompts",
    "prompt_grouped_order",
    "micro_batch_indices",
    "packed_token_budget_partitions",
    "token_budget_partitions",
    "select_batch_keys",
]


def token_budget_partitions(seq_lens: list[int], max_token_len: int, min_parts: int = 1) -> list[list[int]]:
    """Pack rows into micro-batches whose padded size ``rows x max(len)`` is at most ``max_token_len``.

    Rows are visited longest first and appended to the current micro-batch while it fits, so each
    micro-batch holds rows of similar length (little padding). A row longer than the budget gets a
    micro-batch of its own. If fewer than ``min_parts`` micro-batches come out, the largest ones
    are halved until there are ``min_parts`` (needs ``min_parts <= len(seq_lens)``).

    Args:
        seq_lens: ``[rows]`` number of real tokens (prompt + response) per row.
        max_token_len: token budget of one micro-batch.
        min_parts: the number of micro-batches to reach at least (the maximum over the ranks).

    Returns:
        lists of row indices; every row appears exactly once.
    """
    if max_token_len <= 0:
        raise ValueError(f"the token budget must be positive, got {max_token_len}")
    if min_parts > len(seq_lens):
        raise ValueError(f"cannot make {min_parts} micro-batches out of {len(seq_lens)} rows")
    order = sorted(range(len(seq_lens)), key=lambda i: (-seq_lens[i], i))
    parts: list[list[int]] = []
    for idx in order:
        if parts and (len(parts[-1]) + 1) * seq_lens[parts[-1][0]] <= max_token_len:
            parts[-1].append(idx)
        else:
            parts.append([idx])
    while len(parts) < min_parts:
        biggest = max(range(len(parts)), key=lambda p: (len(parts[p]), -p))
        rows = parts.pop(biggest)
        half = len(rows) // 2
        parts[biggest:biggest] = [rows[:half], rows[half:]]
    return parts


def balanced_partitions(costs: list[int], k: int, equal_size: bool = False) -> list[list[int]]:
    """Split items into ``k`` parts with sums as equal as possible: the largest differencing method
    of Karmarkar and Karp (1982), for ``k`` parts as in Korf (2009, "Multi-Way Number Partitioning").

    Each item starts as a partial solution of ``k`` parts (the item in one, the others empty). The two
    partial solutions with the largest spread (largest minus smallest part) are merged by joining the
    largest part of one with the smallest of the other, and so on down, until one solution is left.
    With ``equal_size`` every part gets ``len(costs) / k`` items: the items, sorted, start in groups of
    ``k`` (one per part), and merges keep the counts equal.

    Args:
        costs: ``[items]`` non-negative cost of each item (its tokens).
        k: parts to make, ``1 <= k <= len(costs)`` (``equal_size``: ``k`` divides ``len(costs)``).

    Returns:
        ``k`` lists of item indices, each ascending; every item appears exactly once.
    """
    n = len(costs)
    if not 1 <= k <= n:
        raise ValueError(f"cannot split {n} items into {k} non-empty parts")
    if equal_size and n % k:
        raise ValueError(f"cannot split {n} items into {k} parts of equal size")
    order = sorted(range(n), key=lambda i: (costs[i], i))
    starts = [order[i : i + k] for i in range(0, n, k)] if equal_size else [[i] for i in order]
    heap: list[tuple[int, int, list[int], list[list[int]]]] = []
    for tie, items in enumerate(starts):
        parts = [[i] for i in items] + [[] for _ in range(k - len(items))]
        sums = [sum(costs[i] for i in part) for part in parts]
        heapq.heappush(heap, (-(max(sums) - min(sums)), tie, sums, parts))
    tie = len(starts)
    while len(heap) > 1:
        _, _, sums_a, parts_a = heapq.heappop(heap)
        _, _, sums_b, parts_b = heapq.heappop(heap)
        a = sorted(range(k), key=lambda p: -sums_a[p])
        b = sorted(range(k), key=lambda p: sums_b[p])
        sums = [sums_a[a[p]] + sums_b[b[p]] for p in range(k)]
        parts = [parts_a[a[p]] + parts_b[b[p]] for p in range(k)]
        heapq.heappush(heap, (-(max(sums) - min(sums)), tie, sums, parts))
        tie += 1
    parts = [sorted(part) for part in heap[0][3]]
    for empty in [p for p in range(k) if not parts[p]]:  # k <= n: take a row from the part with the most
        donor = max(range(k), key=lambda p: (len(parts[p]), -p))
        parts[empty] = [parts[donor].pop()]
    return sorted(parts)


def packed_token_budget_partitions(seq_lens: list[int], max_token_len: int, min_parts: int = 1) -> list[list[int]]:
    """Pack rows into micro-batches whose token sum is at most ``max_token_len`` (a packed forward
    costs the sum of its rows' lengths), with sums balanced by :func:`balanced_partitions`.

    A row longer than the budget gets a micro-batch of its own; the other rows go into the fewest
    micro-batches whose balanced split keeps within the budget, or into more when ``min_parts``
    asks for more (needs ``min_parts <= len(seq_lens)``).

    Args:
        seq_lens: ``[rows]`` real tokens per row.
        max_token_len: token budget of one micro-batch.
        min_parts: the number of micro-batches to reach at least (the maximum over the ranks).

    Returns:
        lists of row indices (ascending), every row exactly once.
    """
    if max_token_len <= 0:
        raise ValueError(f"the token budget must be positive, got {max_token_len}")
    if min_parts > len(seq_lens):
        raise ValueError(f"cannot make {min_parts} micro-batches out of {len(seq_lens)} rows")
    alone = [[i] for i, n in enumerate(seq_lens) if n > max_token_len]
    rest = [i for i, n in enumerate(seq_lens) if n <= max_token_len]
    if not rest:
        return alone
    lens = [seq_lens[i] for i in rest]
    k = max(-(-sum(lens) // max_token_len), min_parts - len(alone))
    while True:
        parts = balanced_partitions(lens, k)
        if k == len(lens) or all(sum(lens[j] for j in part) <= max_token_len for part in parts):
            break
        k += 1
    return sorted(alone + [[rest[j] for j in part] for part in parts])


def micro_batch_indices(
    seq_lens: torch.Tensor,
    micro_batch_size: int,
    use_dynamic_bsz: bool,
    max_token_len: int,
    world_size: int,
    packed: bool = False,
) -> list[list[int]]:
    """Row indices of each micro-batch of a local batch.

    Args:
        seq_lens: ``[rows]`` real tokens per row (``attention_mask.sum(-1)``).
        micro_batch_size: rows per micro-batch when not ``use_dynamic_bsz``.
        use_dynamic_bsz: size micro-batches by token budget (collective: all ranks must call).
        max_token_len: the token budget.
        world_size: data-parallel ranks that must agree on the number of micro-batches.
        packed: the forward packs the rows (a micro-batch costs the sum of its rows' lengths, not
            ``rows x longest``): :func:`packed_token_budget_partitions`, else :func:`token_budget_partitions`.
    """
    rows = int(seq_lens.shape[0])
    if not use_dynamic_bsz:
        if micro_batch_size <= 0:
            raise ValueError(f"micro-batch size must be positive, got {micro_batch_size}")
        return [list(range(s, min(s + micro_batch_size, rows))) for s in range(0, rows, micro_batch_size)]
    lens = [int(x) for x in seq_lens.tolist()]
    partitions = packed_token_budget_partitions if packed else token_budget_partitions
    local = len(partitions(lens, max_token_len))
    parts = int(all_reduce_max(torch.tensor([local], dtype=torch.int64), world_size).item())
    return partitions(lens, max_token_len, min_parts=parts)


def select_batch_keys(batch: Mapping[str, torch.Tensor], keys: Sequence[str], method: str) -> dict[str, torch.Tensor]:
    """The tensors ``keys`` of ``batch`` (e.g. ``DataProto.batch``); a clear ``KeyError`` naming
    ``method`` and the missing keys when some are absent."""
    missing = [key for key in keys if key not in batch.keys()]
    if missing:
        raise KeyError(f"{method} needs the batch keys {missing}; got {sorted(batch.keys())}")
    return {key: batch[key] for key in keys}


def distinct_prompts(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The distinct (left-padded) prompts of a batch.

    Args:
        prompt_ids: ``[b, p]`` prompt token ids.
        prompt_mask: ``[b, p]`` 1 on real tokens, 0 on padding (padding ids are ignored).

    Returns:
        ``(first [u], inverse [b])``: ``first[j]`` is the first row holding distinct prompt ``j``
        (in row order), ``inverse[i]`` the distinct prompt of row ``i``; ``first[inverse]`` maps every
        row to a row with the same prompt.
    """
    rows = prompt_ids.shape[0]
    key = torch.where(prompt_mask.bool(), prompt_ids, torch.full_like(prompt_ids, -1))
    _, inverse = torch.unique(key, dim=0, return_inverse=True)
    first = torch.full((int(inverse.max()) + 1,), rows, dtype=torch.long, device=inverse.device)
    first = first.scatter_reduce(0, inverse, torch.arange(rows, device=inverse.device), reduce="amin")
    order = torch.argsort(first)  # number the distinct prompts by first appearance
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=order.device)
    return first[order], rank[inverse]


def prompt_grouped_order(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> list[int]:
    """Row order that puts the rows of each distinct prompt next to each other (prompts in order of
    first appearance, rows of one prompt in their original order), so that micro-batches cut from
    it contain as few distinct prompts as possible. Reordering rows inside a mini-batch does not
    change its gradient."""
    _, inverse = distinct_prompts(prompt_ids, prompt_mask)
    return torch.argsort(inverse, stable=True).tolist()


