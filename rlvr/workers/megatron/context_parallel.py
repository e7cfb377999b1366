"""Context parallelism (``megatron.context_parallel_size``): every sequence split over ``cp`` ranks.

megatron-core 0.16.1 runs context-parallel attention only in transformer-engine's
``TEDotProductAttention`` (its local ``DotProductAttention``, the one rlvr builds because it needs no
CUDA, asserts ``context_parallel_size == 1``). rlvr therefore keeps megatron's model config at
``context_parallel_size=1``, builds megatron-core's context-parallel process groups
(``initialize_model_parallel(context_parallel_size=cp)``: the ``cp`` ranks of a group hold the same
rows and the same weights) and splits the sequences itself:

- **Split** (:meth:`ContextParallel.positions`): a sequence is padded on the right to a multiple of
  ``2 cp`` tokens (masked out) and cut into ``2 cp`` chunks; rank ``c`` holds chunks ``c`` and
  ``2 cp - 1 - c``, megatron's own causal load balance (its ``get_batch_on_this_cp_rank``): the
  early chunk attends to few keys, the late one to many. Embedding, norms, MLP and RoPE (rlvr passes
  the angles of each token's ``position_id``) work token by token on the local chunks.
- **Attention** (:class:`ContextParallelAttention`): the keys and values of all ranks are all-gathered
  into sequence order before the local queries attend to them through the rows of the causal and
  padding mask that belong to the local queries: the all-gather form of context parallelism that
  Llama 3 trained long sequences with (Dubey et al. 2024, "The Llama 3 Herd of Models",
  arXiv:2407.21783, section 3.3.2) and that transformer-engine calls ``cp_comm_type="all_gather"``.
  Its backward sums the key/value gradients of every rank's queries and keeps the local slice.
- **Outputs** (:func:`gather_positions`): per-token results of the local positions (log-probs,
  entropies, values) are all-gathered into sequence order, so every rank of a group computes the same
  loss; the backward of that gather keeps the local slice, so each rank's parameter gradients cover
  its own tokens and their sum over the group (:mod:`rlvr.workers.megatron.grads`) is the gradient
  of the whole sequences.

The collectives are ``all_gather`` and ``all_reduce`` (no ``reduce_scatter``, which gloo lacks); the
numbers equal the unsplit model's up to float32 summation order (``tests/workers/test_megatron_cp.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.transformer.dot_product_attention import DotProductAttention

__all__ = ["ContextParallel", "ContextParallelAttention", "gather_positions"]


@dataclass(frozen=True)
class ContextParallel:
    """This rank's context-parallel group: ``size`` ranks, this one ``rank``, ``group`` (None for one rank)."""

    size: int
    rank: int
    group: object

    def padded_length(self, length: int) -> int:
        """``length`` rounded up to a multiple of ``2 x size`` (the chunks have one length)."""
        chunks = 2 * self.size
        return -(-length // chunks) * chunks

    def positions(self, padded: int, rank: int | None = None) -> torch.Tensor:
        """``[padded / size]`` sequence positions held by ``rank`` (default: this rank), ascending."""
        rank = self.rank if rank is None else rank
        chunk = padded // (2 * self.size)
        first = torch.arange(rank * chunk, (rank + 1) * chunk)
        return torch.cat([first, first + (2 * self.size - 1 - 2 * rank) * chunk])

    def gather_order(self, padded: int) -> torch.Tensor:
        """``[padded]``: index into the concatenation of every rank's positions (rank order) that
        puts them into sequence order."""
        held = torch.cat([self.positions(padded, rank) for rank in range(self.size)])
        return torch.argsort(held)


def _all_gather(x: torch.Tensor, dim: int, cp: ContextParallel) -> torch.Tensor:
    """Every rank's ``x`` concatenated along ``dim`` in sequence order."""
    parts = [torch.empty_like(x) for _ in range(cp.size)]
    dist.all_gather(parts, x.contiguous(), group=cp.group)
    joined = torch.cat(parts, dim=dim)
    order = cp.gather_order(joined.shape[dim]).to(x.device)
    return joined.index_select(dim, order)


class _GatherPositions(torch.autograd.Function):
    """All-gather along ``dim`` into sequence order. Backward: ``summed`` (the gathered tensor fed
    different computations on every rank: keys and values) adds the gradients of all ranks before
    taking the local slice; otherwise (every rank computed the same loss from it) the local slice."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, dim: int, cp: ContextParallel, summed: bool) -> torch.Tensor:
        ctx.dim, ctx.cp, ctx.summed = dim, cp, summed
        return _all_gather(x, dim, cp)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        if ctx.summed:
            grad = grad.contiguous()
            dist.all_reduce(grad, group=ctx.cp.group)
        local = ctx.cp.positions(grad.shape[ctx.dim]).to(grad.device)
        return grad.index_select(ctx.dim, local), None, None, None


def gather_positions(x: torch.Tensor, dim: int, cp: ContextParallel, summed: bool = False) -> torch.Tensor:
    """This rank's positions of a padded sequence (``[..., padded / size, ...]`` along ``dim``) ->
    the whole padded sequence on every rank, differentiable (see :class:`_GatherPositions`)."""
    return _GatherPositions.apply(x, dim, cp, summed) if cp.size > 1 else x


class ContextParallelAttention(DotProductAttention):
    """megatron-core's local ``DotProductAttention`` over the keys and values of the whole sequence.

    Built by ``GPTModel`` in place of the layer spec's core attention when ``cp > 1``; the model config
    stays at ``context_parallel_size=1`` (the base class refuses more) and the group comes from
    megatron-core's ``parallel_state``. Inputs: ``query [s / cp, b, heads, d]`` of the local
    positions, ``key``/``value [s / cp, b, groups, d]`` of the local positions, ``attention_mask
    [b, 1, s / cp, s]`` (True = masked) of the local queries against every key in sequence order.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        group = parallel_state.get_context_parallel_group()
        self.cp = ContextParallel(dist.get_world_size(group), dist.get_rank(group), group)

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        """The base class's attention of the local queries over the gathered keys and values."""
        key = gather_positions(key, 0, self.cp, summed=True)
        value = gather_positions(value, 0, self.cp, summed=True)
        return super().forward(query, key, value, attention_mask, attn_mask_type, attention_bias, packed_seq_params)
