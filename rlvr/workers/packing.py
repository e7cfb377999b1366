"""Sequence packing (``model.use_remove_padding``): the rows of a micro-batch end to end in one row.

A padded micro-batch ``[b, P+R]`` (left-padded prompts, right-padded responses) spends compute and
memory on every padding column. Packed, its real tokens are concatenated into one row
``[1, T]`` (``T`` = the sum of the rows' lengths), each keeping its own position ids, and attention
runs per sequence on the boundaries ``cu_seqlens`` (:mod:`rlvr.workers.packed_attention`): no token
attends across a boundary, so every output equals the padded forward's, with no padding computed.
Under Ulysses sequence parallelism (:mod:`rlvr.workers.ulysses`) the packed row is padded to a
multiple of the group size (the padding is a sequence of its own) and each rank runs one slice.

The outputs the trainer needs are per response token; :class:`PackedBatch` knows which packed
position predicts which response token, and puts per-position values back into the
``[b, response_len]`` layout (zero where a row has no response token).

Model inputs: :meth:`PackedBatch.model_inputs` is the one place that builds the keyword arguments
of a packed model call (token ids, position ids, the sequence boundaries, the sequence-parallel
group); a model that needs more inputs adds them there.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlvr.workers.ulysses import SequenceParallel, gather_sequence

__all__ = ["PackedBatch", "pack_batch", "SEQUENCE_PARALLEL_KWARG"]

SEQUENCE_PARALLEL_KWARG = "rlvr_sequence_parallel"
"""Keyword argument that carries the :class:`~rlvr.workers.ulysses.SequenceParallel` group through the
model's forward to the attention function (kept by activation checkpointing for the recompute)."""


@dataclass
class PackedBatch:
    """A micro-batch packed into one row, and where its response tokens are.

    Attributes:
        input_ids: ``[1, T]`` token ids of every row's real tokens, row after row (plus padding to a
            multiple of the sequence-parallel size, as a sequence of its own).
        position_ids: ``[1, T]`` each token's position id in its own row.
        cu_seqlens: ``[n + 1]`` int32 boundaries of the sequences in the packed row (``cu_seqlens[0] = 0``,
            ``cu_seqlens[-1] = T``).
        max_seqlen: the longest sequence.
        response_positions: ``[N]`` packed positions whose output predicts a response token (ascending).
        response_index: ``[N]`` where each of those goes in the flattened ``[b * response_len]`` layout.
        labels: ``[N]`` the response token each of those positions predicts.
        rows: ``b``.
        response_len: ``R``.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int
    response_positions: torch.Tensor
    response_index: torch.Tensor
    labels: torch.Tensor
    rows: int
    response_len: int

    @property
    def total_len(self) -> int:
        return self.input_ids.shape[1]

    def local_slice(self, sp: SequenceParallel) -> slice:
        """The packed positions this rank runs: all of them, or its ``1 / size`` under sequence parallelism."""
        length = self.total_len // sp.size
        return slice(sp.rank * length, (sp.rank + 1) * length)

    def local_response_positions(self, sp: SequenceParallel) -> torch.Tensor:
        """``[n]`` positions inside this rank's slice that predict response tokens (slice coordinates)."""
        part = self.local_slice(sp)
        positions = self.response_positions
        inside = (positions >= part.start) & (positions < part.stop)
        return positions[inside] - part.start

    def local_labels(self, sp: SequenceParallel) -> torch.Tensor:
        """``[n]`` the response tokens predicted at :meth:`local_response_positions`."""
        part = self.local_slice(sp)
        positions = self.response_positions
        return self.labels[(positions >= part.start) & (positions < part.stop)]

    def model_inputs(self, sp: SequenceParallel) -> dict:
        """Keyword arguments of the model call on this rank's slice: ``input_ids``/``position_ids``
        ``[1, T / size]``, no attention mask (the boundaries replace it), the boundaries under the
        names of transformers' packed-sequence (flash-attention varlen) arguments, and the group."""
        part = self.local_slice(sp)
        inputs = {
            "input_ids": self.input_ids[:, part],
            "position_ids": self.position_ids[:, part],
            "attention_mask": None,
            "cu_seq_lens_q": self.cu_seqlens,
            "cu_seq_lens_k": self.cu_seqlens,
            "max_length_q": self.max_seqlen,
            "max_length_k": self.max_seqlen,
        }
        if sp.enabled:
            inputs[SEQUENCE_PARALLEL_KWARG] = sp
        return inputs

    def unpack(self, local_values: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
        """Values at :meth:`local_response_positions` (``[n]``, this rank's) -> ``[b, response_len]``
        (float32, zero where a row has no response token), gathered over the sequence-parallel group
        first; differentiable."""
        values = local_values.float()
        if sp.enabled:
            part = self.local_slice(sp)
            dense = values.new_zeros(part.stop - part.start).index_copy(0, self.local_response_positions(sp), values)
            values = gather_sequence(dense, sp).index_select(0, self.response_positions)
        flat = values.new_zeros(self.rows * self.response_len).index_copy(0, self.response_index, values)
        return flat.view(self.rows, self.response_len)


def pack_batch(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
               response_len: int, pad_to_multiple_of: int = 1) -> PackedBatch:
    """Pack the real tokens (``attention_mask == 1``) of a micro-batch into one row.

    Args:
        input_ids, attention_mask, position_ids: ``[b, P+R]``, prompts left-padded, responses
            right-padded (the layout of the rollout's output): each row's real tokens in one block.
        response_len: ``R``, the response columns at the end.
        pad_to_multiple_of: pad the packed row to a multiple of this (the sequence-parallel size).

    Returns:
        the :class:`PackedBatch`; the response token in column ``P + k`` of row ``i`` is predicted by
        the packed position of column ``P + k - 1``.

    Raises:
        ValueError: a row without real tokens, or with padding between real tokens.
    """
    rows, width = attention_mask.shape
    prompt_len = width - response_len
    if prompt_len < 1:
        raise ValueError(f"need at least one prompt column before the {response_len} response columns, got {width}")
    mask = attention_mask.bool()
    lengths = mask.sum(-1)
    if bool((lengths == 0).any()):
        raise ValueError("a row has no real token (attention_mask all zero); every row needs at least one")
    runs = (mask[:, 1:] & ~mask[:, :-1]).sum(-1) + mask[:, 0]  # blocks of real tokens per row
    if bool((runs != 1).any()):
        row = int((runs != 1).nonzero()[0])
        raise ValueError(f"packing needs each row's real tokens in one block (prompts left-padded, responses "
                         f"right-padded: the rollout's layout); row {row} has padding between real tokens")
    flat_mask = mask.flatten()
    ids = input_ids.flatten()[flat_mask]
    pos = position_ids.flatten()[flat_mask]
    packed_pos = (flat_mask.long().cumsum(0) - 1).view(rows, width)  # packed position of each real cell
    predicts = mask[:, prompt_len:] & mask[:, prompt_len - 1 : -1]  # [b, R] response token with a real predecessor
    response_positions = packed_pos[:, prompt_len - 1 : -1][predicts]
    response_index = torch.arange(rows * response_len, device=mask.device).view(rows, response_len)[predicts]
    labels = input_ids[:, prompt_len:][predicts]
    seqlens = lengths.tolist()
    total = ids.shape[0]
    pad = -total % pad_to_multiple_of
    if pad:
        ids = torch.cat([ids, ids.new_zeros(pad)])
        pos = torch.cat([pos, torch.arange(pad, dtype=pos.dtype, device=pos.device)])
        seqlens.append(pad)
    cu_seqlens = torch.zeros(len(seqlens) + 1, dtype=torch.int32, device=mask.device)
    cu_seqlens[1:] = torch.tensor(seqlens, dtype=torch.int32).cumsum(0)
    return PackedBatch(
        input_ids=ids[None], position_ids=pos[None], cu_seqlens=cu_seqlens, max_seqlen=max(seqlens),
        response_positions=response_positions, response_index=response_index, labels=labels,
        rows=rows, response_len=response_len,
    )
