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
The actor's shared-prompt forward (:mod:`rlvr.workers.actor.shared_prompt`) runs in two segments,
each distinct prompt once and then every row's response on its cache: :class:`SharedPromptLayout`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlvr.workers.packing import PackedBatch
from rlvr.workers.ulysses import SequenceParallel, gather_sequence

__all__ = ["ROUTED_EXPERTS", "ROUTED_EXPERTS_NUM_EXPERTS", "SharedPromptLayout", "TokenLayout", "empty_routes",
           "routes_dtype"]

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

    def token_weights(self) -> torch.Tensor:
        """``[T]``: how many times each token counts in the load-balancing loss and the expert load
        (:meth:`token_mask`: each real token once)."""
        return self.token_mask()

    @property
    def segments(self) -> None:
        """One forward pass, one segment (see :attr:`SharedPromptLayout.segments`)."""
        return None

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


@dataclass(frozen=True)
class SharedPromptLayout:
    """The tokens of a shared-prompt forward of a padded window ``start:stop`` (the actor's, see
    :func:`~rlvr.workers.actor.shared_prompt.shared_prompt_hidden`), in the routers' order: segment 0
    runs columns ``start:prompt_stop`` of one row per distinct prompt (``first``), segment 1 columns
    ``prompt_stop:stop`` of every row. Each prompt token stands for the ``n`` rows of its prompt.

    Attributes:
        prompt: the prompt segment's layout (``first``'s rows, columns ``start:prompt_stop``).
        response: the response segment's layout (every row, columns ``prompt_stop:stop``).
        first: ``[u]`` a row of each distinct prompt.
        inverse: ``[b]`` each row's distinct prompt (an index into ``first``).
    """

    prompt: TokenLayout
    response: TokenLayout
    first: torch.Tensor
    inverse: torch.Tensor
    packed_len: None = None

    @classmethod
    def padded(cls, attention_mask: torch.Tensor, start: int, prompt_stop: int, stop: int, first: torch.Tensor,
               inverse: torch.Tensor) -> SharedPromptLayout:
        """The shared-prompt forward of window ``start:stop`` of ``attention_mask [b, S]`` whose
        prompts end at column ``prompt_stop``; ``first``/``inverse`` from
        :func:`~rlvr.workers.batching.distinct_prompts`."""
        mask = attention_mask.bool()
        first, inverse = first.to(mask.device), inverse.to(mask.device)
        return cls(prompt=TokenLayout.padded(mask.index_select(0, first), start, prompt_stop),
                   response=TokenLayout.padded(mask, prompt_stop, stop), first=first, inverse=inverse)

    @property
    def segments(self) -> tuple[int, int]:
        """The tokens of the two segments: ``(u x prompt columns, b x response columns)``."""
        return self.prompt.token_mask().numel(), self.response.token_mask().numel()

    def token_mask(self) -> torch.Tensor:
        """``[T]`` bool: which of the forward's tokens are real (not padding)."""
        return torch.cat([self.prompt.token_mask(), self.response.token_mask()])

    def token_weights(self) -> torch.Tensor:
        """``[T]`` float32: a real response token counts once, a real prompt token once per row of its
        prompt (as often as the plain forward, which runs it in every row, counts it); 0 on padding."""
        rows = torch.bincount(self.inverse, minlength=self.first.numel()).float()
        window = self.prompt.window
        per_token = rows.repeat_interleave(window.stop - window.start)
        return torch.cat([self.prompt.token_mask().float() * per_token, self.response.token_mask().float()])

    def prompt_routes_agree(self, routes: torch.Tensor) -> bool:
        """Whether every row of a prompt carries the same routes ``[b, S, layers, k]`` on its (real)
        prompt tokens as the prompt's ``first`` row, so that replaying that row's is replaying each row's."""
        window = self.prompt.window
        mask = self.response.mask[:, window, None, None]
        own = routes[:, window].to(mask.device).masked_fill(~mask, -1)
        return bool(torch.equal(own, own.index_select(0, self.first).index_select(0, self.inverse)))

    def tokens(self, routes: torch.Tensor) -> torch.Tensor:
        """``routes [b, S, layers, k]`` in the forward's token order: ``[T, layers, k]`` int64, ``-1``
        on padding; the prompt segment takes the routes of each prompt's ``first`` row."""
        routes = routes.to(self.first.device)
        return torch.cat([self.prompt.tokens(routes.index_select(0, self.first)), self.response.tokens(routes)])

    def place(self, tokens: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
        """The inverse of :meth:`tokens`: ``[b, S, layers, k]`` int16, each row's prompt columns the
        routes of its prompt (as the plain forward records them: the prompt's routes in every row),
        ``-1`` on padding. ``sp`` is unused (a padded forward holds whole rows)."""
        split = self.segments[0]
        out = self.prompt.place(tokens[:split], sp).index_select(0, self.inverse.to(tokens.device))
        window = self.response.window
        out[:, window] = self.response.place(tokens[split:], sp)[:, window]
        return out
