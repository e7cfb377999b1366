"""Ulysses sequence parallelism: one (packed) sequence split over the ranks of a group.

DeepSpeed-Ulysses (Jacobs et al. 2023, "DeepSpeed Ulysses: System Optimizations for Enabling
Training of Extreme Long Sequence Transformer Models", arXiv:2309.14509). ``size`` consecutive ranks
form a sequence-parallel group; they hold the same rows, and each runs the model on one contiguous
slice of the packed sequence (``[1, T / size]``). Everything but attention works token by token, so
it runs on the slice as it is; attention needs the whole sequence, so around it an all-to-all swaps
the split: from "all heads, my tokens" to "my heads, all tokens" and back
(:func:`heads_to_sequence`, :func:`sequence_to_heads`). Each rank then holds ``1 / size`` of the
activations of a sequence.

How the ranks of a group share the work:

- the worker group splits a batch over all ranks as usual; the ranks of a group exchange their
  rows first (:func:`gather_rows`), so each group sees the union of its ranks' rows, and each rank
  returns the results of its own rows (:func:`own_rows`);
- the per-token outputs of the slices (log-probs, entropies, values) are all-gathered
  (:func:`gather_sequence`), so every rank of a group computes the same loss; the backward of that
  gather keeps each rank's own slice, so the gradients of the ranks of a group add up to the
  gradient of the group's loss (FSDP2, sharded over all ranks, then sums them);
- FSDP2 averages gradients over all ranks, of which only ``world_size / size`` hold different
  rows: :func:`rlvr.workers.ppo_update.update_mini_batch` counts every group once.

The head counts must split over the group: ``num_attention_heads % size == 0`` and either
``num_key_value_heads % size == 0`` or ``size % num_key_value_heads == 0`` (then each key/value head
is repeated ``size / num_key_value_heads`` times before the all-to-all), checked before any worker
starts by :func:`check_attention_heads`.

The collectives are ``all_to_all`` and ``all_gather``, which gloo (CPU) and NCCL (GPU) both
implement in torch 2.13.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from rlvr.utils.errors import ConfigError

__all__ = [
    "SequenceParallel",
    "sequence_parallel_group",
    "check_attention_heads",
    "check_model_heads",
    "heads_to_sequence",
    "sequence_to_heads",
    "gather_sequence",
    "gather_rows",
    "own_rows",
    "shared_generator",
]


@dataclass(frozen=True)
class SequenceParallel:
    """This rank's sequence-parallel group.

    Attributes:
        size: ranks in the group (1: no sequence parallelism).
        rank: this rank's place in the group (``0..size-1``).
        group: the process group (None when ``size == 1``).
    """

    size: int = 1
    rank: int = 0
    group: dist.ProcessGroup | None = None

    @property
    def enabled(self) -> bool:
        return self.size > 1


_GROUPS: dict[tuple[int, int], SequenceParallel] = {}
"""This process's groups by (default process group, size): made once per process group."""


def sequence_parallel_group(size: int, world_size: int) -> SequenceParallel:
    """This rank's group of ``size`` consecutive ranks (collective the first time a size is asked
    for: every rank must call it, in the same order). ``size == 1`` needs no process group.

    Raises:
        ValueError: ``size`` does not divide ``world_size``.
    """
    if size == 1:
        return SequenceParallel()
    if size < 1 or world_size % size != 0:
        raise ValueError(f"ulysses_sequence_parallel_size={size} must divide the {world_size} ranks of the "
                         "worker group")
    key = (id(dist.group.WORLD), size)
    if key not in _GROUPS:
        rank = dist.get_rank()
        for start in range(0, world_size, size):
            group = dist.new_group(list(range(start, start + size)))  # every rank creates every group
            if start <= rank < start + size:
                _GROUPS[key] = SequenceParallel(size, rank - start, group)
    return _GROUPS[key]


def check_attention_heads(num_heads: int, num_kv_heads: int, size: int, key: str) -> None:
    """Raise :class:`ConfigError` at ``key`` unless the heads split over ``size`` ranks (module docstring)."""
    if size < 1:
        raise ConfigError(key, f"must be >= 1, got {size}")
    if num_heads % size != 0:
        raise ConfigError(key, f"the model has {num_heads} attention heads, which do not split over {size} "
                               f"sequence-parallel ranks; use a size that divides {num_heads}")
    if num_kv_heads % size != 0 and size % num_kv_heads != 0:
        raise ConfigError(key, f"the model has {num_kv_heads} key/value heads: a sequence-parallel size must divide "
                               f"them or be a multiple of them, {size} is neither")


def check_model_heads(path: str, size: int, key: str, trust_remote_code: bool = False) -> None:
    """:func:`check_attention_heads` for the model at ``path`` (reads its config only; a model without
    ``num_key_value_heads`` has as many as attention heads)."""
    from transformers import AutoConfig

    from rlvr.utils.model import local_model_dir

    text = AutoConfig.from_pretrained(local_model_dir(path), trust_remote_code=trust_remote_code).get_text_config()
    heads = text.num_attention_heads
    check_attention_heads(heads, getattr(text, "num_key_value_heads", None) or heads, size, key)


def _all_to_all(x: torch.Tensor, scatter_dim: int, gather_dim: int, sp: SequenceParallel) -> torch.Tensor:
    inputs = [part.contiguous() for part in x.chunk(sp.size, dim=scatter_dim)]
    outputs = [torch.empty_like(inputs[0]) for _ in range(sp.size)]
    dist.all_to_all(outputs, inputs, group=sp.group)
    return torch.cat(outputs, dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    """Split ``scatter_dim`` over the group and join what the others send along ``gather_dim``;
    the backward is the same exchange the other way round."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, scatter_dim: int, gather_dim: int, sp: SequenceParallel) -> torch.Tensor:
        ctx.dims, ctx.sp = (scatter_dim, gather_dim), sp
        return _all_to_all(x, scatter_dim, gather_dim, sp)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        scatter_dim, gather_dim = ctx.dims
        return _all_to_all(grad, gather_dim, scatter_dim, ctx.sp), None, None, None


def heads_to_sequence(x: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
    """``[b, heads, s, d]`` (all heads, this rank's slice of the tokens) -> ``[b, heads / size, s x size, d]``
    (this rank's heads, all tokens in order). Key/value heads fewer than ``size`` are repeated first."""
    heads = x.shape[1]
    if heads < sp.size:
        x = x.repeat_interleave(sp.size // heads, dim=1)
    return _AllToAll.apply(x, 1, 2, sp)


def sequence_to_heads(x: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
    """``[b, S, heads / size, d]`` (this rank's heads, all tokens) -> ``[b, S / size, heads, d]``."""
    return _AllToAll.apply(x, 1, 2, sp)


class _GatherSequence(torch.autograd.Function):
    """All-gather the slices along dim 0; the backward keeps this rank's slice of the gradient
    (every rank of the group computes the same loss from the gathered tensor)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
        ctx.sp, ctx.length = sp, x.shape[0]
        parts = [torch.empty_like(x) for _ in range(sp.size)]
        dist.all_gather(parts, x.contiguous(), group=sp.group)
        return torch.cat(parts, dim=0)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        start = ctx.sp.rank * ctx.length
        return grad[start : start + ctx.length], None


def gather_sequence(x: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
    """``[s, ...]`` per rank -> ``[s x size, ...]`` on every rank, differentiable (see :class:`_GatherSequence`)."""
    return _GatherSequence.apply(x, sp) if sp.enabled else x


def gather_rows(batch: dict[str, torch.Tensor], sp: SequenceParallel, block: int | None = None
                ) -> dict[str, torch.Tensor]:
    """The rows of every rank of the group, ``[size x b, ...]`` per key (no gradient).

    The worker group gives each rank ``b`` rows (the same count on every rank). Without ``block`` the
    result holds rank 0's rows, then rank 1's, ... (:func:`own_rows` picks a rank's part back out).
    With ``block`` (the per-rank mini-batch size of an update) the rows are interleaved block by
    block: mini-batch ``j`` of the group is then rows ``j x block .. (j+1) x block - 1`` of every rank,
    the same global mini-batch as without sequence parallelism.
    """
    if not sp.enabled:
        return batch
    out = {}
    for key, value in batch.items():
        parts = [torch.empty_like(value) for _ in range(sp.size)]
        dist.all_gather(parts, value.contiguous(), group=sp.group)
        out[key] = torch.cat(parts, dim=0)
    if block is None:
        return out
    rows = next(iter(batch.values())).shape[0]
    order = [rank * rows + i for start in range(0, rows, block) for rank in range(sp.size)
             for i in range(start, min(start + block, rows))]
    index = torch.tensor(order)
    return {key: value[index] for key, value in out.items()}


def own_rows(values: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
    """This rank's rows of a result over :func:`gather_rows` (without ``block``): ``[size x b, ...] -> [b, ...]``."""
    if not sp.enabled:
        return values
    rows = values.shape[0] // sp.size
    return values[sp.rank * rows : (sp.rank + 1) * rows]


def shared_generator(sp: SequenceParallel) -> torch.Generator | None:
    """A random generator seeded alike on the ranks of a group (from group rank 0's global RNG), so
    that they shuffle their shared rows the same way; None (the global RNG) without sequence parallelism."""
    if not sp.enabled:
        return None
    seed = torch.randint(0, 2**62, (1,))
    dist.broadcast(seed, src=dist.get_global_rank(sp.group, 0), group=sp.group)
    return torch.Generator().manual_seed(int(seed))
