"""Splitting a worker's batch into mini-batches and micro-batches.

A micro-batch is a list of row indices into the worker's local batch. Two ways to size them:

- by count: ``micro_batch_size`` rows each (the last one may be shorter);
- by token budget (``use_dynamic_bsz``): rows sorted by length and packed so that a micro-batch's
  padded size ``rows x longest row`` stays within ``max_token_len``. Every rank of a data-parallel
  group must run the same number of forward passes (FSDP2 all-gathers parameters in each one), so
  the count is raised to the largest count of any rank by splitting the biggest micro-batches.

The loss of a micro-batch is weighted by its share of the *global* mini-batch (all ranks), see
:func:`loss_share`, so that gradient accumulation over micro-batches and averaging over ranks give
exactly the gradient of one big batch.

Rows that share a prompt (``rollout.n`` responses per prompt) are found by :func:`distinct_prompts`,
so that the prompt is run once (prefill in the rollout, shared forward in the actor) and micro-batches
keep a prompt's rows together (:func:`prompt_grouped_order`); the prompt's KV cache rows are then
copied out to its rows by :func:`select_cache_rows`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence

import torch
import torch.distributed as dist
from transformers.cache_utils import Cache, DynamicLayer

__all__ = [
    "distinct_prompts",
    "prompt_grouped_order",
    "select_cache_rows",
    "micro_batch_indices",
    "token_budget_partitions",
    "loss_share",
    "all_reduce_sum",
    "all_reduce_max",
    "select_batch_keys",
    "run_mini_batch_epochs",
]


def all_reduce_sum(value: torch.Tensor, world_size: int) -> torch.Tensor:
    """Sum of ``value`` over the data-parallel group (identity when ``world_size == 1``)."""
    if world_size == 1:
        return value
    out = value.clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def all_reduce_max(value: torch.Tensor, world_size: int) -> torch.Tensor:
    """Maximum of ``value`` over the data-parallel group (identity when ``world_size == 1``)."""
    if world_size == 1:
        return value
    out = value.clone()
    dist.all_reduce(out, op=dist.ReduceOp.MAX)
    return out


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


def micro_batch_indices(
    seq_lens: torch.Tensor,
    micro_batch_size: int,
    use_dynamic_bsz: bool,
    max_token_len: int,
    world_size: int,
) -> list[list[int]]:
    """Row indices of each micro-batch of a local batch.

    Args:
        seq_lens: ``[rows]`` real tokens per row (``attention_mask.sum(-1)``).
        micro_batch_size: rows per micro-batch when not ``use_dynamic_bsz``.
        use_dynamic_bsz: size micro-batches by token budget (collective: all ranks must call).
        max_token_len: the token budget.
        world_size: data-parallel ranks that must agree on the number of micro-batches.
    """
    rows = int(seq_lens.shape[0])
    if not use_dynamic_bsz:
        if micro_batch_size <= 0:
            raise ValueError(f"micro-batch size must be positive, got {micro_batch_size}")
        return [list(range(s, min(s + micro_batch_size, rows))) for s in range(0, rows, micro_batch_size)]
    lens = [int(x) for x in seq_lens.tolist()]
    local = len(token_budget_partitions(lens, max_token_len))
    parts = int(all_reduce_max(torch.tensor([local], dtype=torch.int64), world_size).item())
    return token_budget_partitions(lens, max_token_len, min_parts=parts)


def loss_share(response_mask: torch.Tensor, global_tokens: float, global_seqs: float, loss_agg_mode: str,
               world_size: int) -> float:
    """Weight of a micro-batch's aggregated loss inside the global mini-batch.

    ``agg_loss`` averages over the micro-batch (tokens for ``token-mean``, non-empty sequences for
    the ``seq-mean-*`` modes). Multiplying by ``micro count / global count`` turns the sum over
    micro-batches and ranks into the average over the whole mini-batch; the factor ``world_size``
    undoes FSDP's averaging of gradients over ranks (``token-sum`` needs only that factor).

    Args:
        response_mask: ``[micro_rows, response_len]`` of the micro-batch.
        global_tokens: valid tokens in the mini-batch over all ranks.
        global_seqs: sequences with at least one valid token in the mini-batch over all ranks.
    """
    if loss_agg_mode == "token-sum":
        return float(world_size)
    if loss_agg_mode == "token-mean":
        return float(response_mask.sum()) / max(global_tokens, 1.0) * world_size
    return float((response_mask.sum(-1) > 0).sum()) / max(global_seqs, 1.0) * world_size


def select_batch_keys(batch: Mapping[str, torch.Tensor], keys: Sequence[str], method: str) -> dict[str, torch.Tensor]:
    """The tensors ``keys`` of ``batch`` (e.g. ``DataProto.batch``); a clear ``KeyError`` naming
    ``method`` and the missing keys when some are absent."""
    missing = [key for key in keys if key not in batch.keys()]
    if missing:
        raise KeyError(f"{method} needs the batch keys {missing}; got {sorted(batch.keys())}")
    return {key: batch[key] for key in keys}


def run_mini_batch_epochs(
    batch: dict[str, torch.Tensor],
    train_mini_batch: Callable[[dict[str, torch.Tensor]], dict[str, float]],
    *,
    epochs: int,
    mini_batch_size: int,
    shuffle: bool,
) -> dict[str, list[float]]:
    """``epochs`` passes over ``batch`` (tensors ``[rows, ...]``) in mini-batches of
    ``mini_batch_size`` rows (in a fresh random order each epoch when ``shuffle``), calling
    ``train_mini_batch`` on each; returns metric name -> one value per mini-batch."""
    rows = next(iter(batch.values())).shape[0]
    metrics: dict[str, list[float]] = defaultdict(list)
    for _ in range(epochs):
        order = torch.randperm(rows) if shuffle else torch.arange(rows)
        for start in range(0, rows, mini_batch_size):
            index = order[start : start + mini_batch_size]
            mini = {key: value[index] for key, value in batch.items()}
            for name, value in train_mini_batch(mini).items():
                metrics[name].append(value)
    return dict(metrics)


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


def select_cache_rows(cache: Cache, rows: torch.Tensor) -> None:
    """Keep, in place, cache rows ``rows`` (``[b]`` indices into the cache's batch dimension; repeats
    allowed) with a deterministic backward.

    Every layer that selects rows as transformers' ``DynamicLayer`` does (sliding-window layers
    included; keys and values ``[u, heads, seq, head_dim]`` -> ``[b, heads, seq, head_dim]``) is
    selected with ``index_select``; a layer with its own selection (quantized, indexed, ...) keeps
    its ``batch_select_indices``, which is
    correct but, for gradients on CPU, not bit-reproducible: its advanced indexing has an
    ``index_put_(accumulate=True)`` backward whose threads add into a shared row in a varying order.
    """
    for layer in cache.layers:
        plain = type(layer).batch_select_indices is DynamicLayer.batch_select_indices
        if plain and getattr(layer, "keys", None) is not None and layer.keys.numel() > 0:
            layer.keys = layer.keys.index_select(0, rows)
            layer.values = layer.values.index_select(0, rows)
        else:
            layer.batch_select_indices(rows)
