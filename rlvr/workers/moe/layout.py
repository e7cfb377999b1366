"""Where each token of a batch meets the routers: the batch's ``routed_experts`` and a forward pass's tokens.

``routed_experts [B, S, layers, k]`` (int16; ``S`` = the columns of ``input_ids``, prompt and
response) says which experts every token was sent to in every MoE layer, ``-1`` where no choice is
known (padding; the last sampled token, which the rollout never ran through the model). The rollout
engine writes it (``rollout.enable_rollout_routing_replay``); the actor's ``compute_log_prob`` writes it
for ``router_replay.mode=R2``; the actor's forward passes read it to replay the choices.

The routers see a forward pass's tokens flattened, ``[T, hidden]``: a padded forward's ``rows x
columns`` of the window it runs (``columns x rows`` in megatron-core, whose activations are sequence-major) (:func:`~rlvr.workers.actor.dp_actor.response_window`), or the packed
row of ``model.use_remove_padding`` (the real tokens row after row, padding for sequence parallelism
at the end; under Ulysses each rank runs its slice). :class:`TokenLayout` maps between the two.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlvr.workers.packing import PackedBatch
from rlvr.workers.ulysses import SequenceParallel, gather_sequence

__all__ = ["ROUTED_EXPERTS", "ROUTED_EXPERTS_NUM_EXPERTS", "TokenLayout", "empty_routes", "routes_dtype"]

ROUTED_EXPERTS = "routed_experts"
"""Batch key of the experts each token was routed to, ``[B, S, layers, k]`` (module docstring)."""

ROUTED_EXPERTS_NUM_EXPERTS = "routed_experts_num_experts"
"""``meta_info`` key of a rollout output with routes: the experts per MoE layer, ``E``."""


def routes_dtype(num_experts: int) -> torch.dtype:
    """int16 for the expert ids (and ``-1``); more than 32767 experts do not fit it."""
    if num_experts > torch.iinfo(torch.int16).max:
        raise ValueError(f"{num_experts} experts do not fit the int16 routed_experts")
    return torch.int16


def empty_routes(rows: int, columns: int, layers: int, top_k: int, num_experts: int) -> torch.Tensor:
    """``[rows, columns, layers, top_k]`` of ``-1``: no choice known yet."""
    return torch.full((rows, columns, layers, top_k), -1, dtype=routes_dtype(num_experts))


@dataclass(frozen=True)
class TokenLayout:
    """The tokens one forward pass runs, in the routers' order.

    Attributes:
        mask: ``[b, S]`` bool, the real tokens of the micro-batch.
        window: the columns a padded forward runs (None for a packed forward).
        packed_len: the packed row's length, sequence-parallel padding included (None: padded forward).
        part: this rank's slice of the packed row (all of it without sequence parallelism).
        seq_major: a padded forward's tokens column by column (megatron-core's ``[s, b]`` order).
    """

    mask: torch.Tensor
    window: slice | None = None
    packed_len: int | None = None
    part: slice | None = None
    seq_major: bool = False

    @classmethod
    def padded(cls, attention_mask: torch.Tensor, start: int, stop: int, seq_major: bool = False) -> TokenLayout:
        """A forward on columns ``start:stop`` of ``attention_mask [b, S]`` (column by column with ``seq_major``)."""
        return cls(mask=attention_mask.bool(), window=slice(start, stop), seq_major=seq_major)

    @classmethod
    def packed(cls, attention_mask: torch.Tensor, packed: PackedBatch, sp: SequenceParallel) -> TokenLayout:
        """A forward on this rank's slice of the packed micro-batch ``packed``."""
        return cls(mask=attention_mask.bool(), packed_len=packed.total_len, part=packed.local_slice(sp))

    def token_mask(self) -> torch.Tensor:
        """``[T]`` bool: which of the forward's tokens are real (not padding)."""
        if self.window is not None:
            window = self.mask[:, self.window]
            return (window.t() if self.seq_major else window).flatten()
        real = int(self.mask.sum())
        return (torch.arange(self.packed_len, device=self.mask.device) < real)[self.part]

    def tokens(self, routes: torch.Tensor) -> torch.Tensor:
        """``routes [b, S, layers, k]`` in the forward's token order: ``[T, layers, k]`` int64, ``-1`` on padding."""
        routes = routes.to(self.mask.device).long()
        if self.window is not None:
            picked = routes[:, self.window].masked_fill(~self.mask[:, self.window, None, None], -1)
            return (picked.transpose(0, 1) if self.seq_major else picked).flatten(0, 1)
        real = routes[self.mask]
        padding = real.new_full((self.packed_len - real.shape[0], *real.shape[1:]), -1)
        return torch.cat([real, padding])[self.part]

    def place(self, tokens: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
        """The inverse of :meth:`tokens`: the forward's ``[T, layers, k]`` back to ``[b, S, layers, k]``
        (int16, ``-1`` on padding); a packed forward's slices are gathered over the sequence-parallel
        group first (collective)."""
        rows, columns = self.mask.shape
        out = torch.full((rows, columns, *tokens.shape[1:]), -1, dtype=torch.int16, device=tokens.device)
        if self.window is not None:
            if self.seq_major:
                window = tokens.view(-1, rows, *tokens.shape[1:]).transpose(0, 1)
            else:
                window = tokens.view(rows, -1, *tokens.shape[1:])
            out[:, self.window] = window.to(torch.int16).masked_fill(~self.mask[:, self.window, None, None], -1)
            return out
        whole = gather_sequence(tokens, sp) if sp.enabled else tokens
        out[self.mask] = whole[: int(self.mask.sum())].to(torch.int16)
        return out
