"""Response log-probs (and their statistics) of a micro-batch run as one packed row (``model.use_remove_padding``).

The micro-batch is packed (:func:`rlvr.workers.packing.pack_batch`), the model runs on the packed
row (on this rank's slice of it under Ulysses sequence parallelism) with attention kept inside each
sequence (:mod:`rlvr.workers.packed_attention`), and the LM head runs only on the positions that
predict response tokens. The per-token results go back to the ``[b, response_len]`` layout; they equal
the padded forward's (:func:`rlvr.workers.actor.dp_actor.response_logits`) on every response token.

Two heads, as in the padded path: with one unsharded rank and a plain LM head, the chunked
:func:`~rlvr.workers.actor.linear_log_probs.linear_log_probs` on the decoder's hidden states (no
``[tokens, vocab]`` logits held); otherwise the whole model's forward with ``logits_to_keep`` = those
positions (FSDP2 all-gathers the root's parameters in the root's forward), and log-softmax on the logits.
"""

from __future__ import annotations

import torch
from torch import nn

from rlvr.utils.torch_functional import DEFAULT_CHUNK_ROWS
from rlvr.workers.actor.linear_log_probs import linear_token_stats
from rlvr.workers.actor.token_stats import logits_token_stats
from rlvr.workers.models import unwrap_hf_model
from rlvr.workers.packed_attention import packed_forward
from rlvr.workers.packing import PackedBatch, pack_batch
from rlvr.workers.ulysses import SequenceParallel

__all__ = ["pack_micro_batch", "packed_log_probs"]


def pack_micro_batch(batch: dict[str, torch.Tensor], sp: SequenceParallel) -> PackedBatch:
    """The micro-batch ``input_ids``/``attention_mask``/``position_ids [b, P+R]``, ``responses [b, R]``
    packed, padded to a multiple of the sequence-parallel size."""
    return pack_batch(batch["input_ids"], batch["attention_mask"], batch["position_ids"],
                      batch["responses"].shape[1], pad_to_multiple_of=sp.size)


def _head_inputs(module: nn.Module, packed: PackedBatch, sp: SequenceParallel, chunked_head: bool
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(hidden [n, H], lm_head weight)`` with ``chunked_head``, else ``(logits [n, vocab], None)``,
    at this rank's positions that predict response tokens."""
    positions = packed.local_response_positions(sp)
    inputs = packed.model_inputs(sp)
    with packed_forward():
        if chunked_head:
            model = unwrap_hf_model(module)
            hidden = model.get_decoder()(**inputs, use_cache=False).last_hidden_state[0]
            return hidden.index_select(0, positions), model.get_output_embeddings().weight
        return module(**inputs, use_cache=False, logits_to_keep=positions).logits[0], None


def packed_log_probs(module: nn.Module, batch: dict[str, torch.Tensor], temperature: float,
                     calculate_entropy: bool, entropy_grad: bool, chunked_head: bool, sp: SequenceParallel,
                     calculate_sum_pi_squared: bool = False, entropy_chunk: int = DEFAULT_CHUNK_ROWS,
                     packed: PackedBatch | None = None) -> dict[str, torch.Tensor]:
    """Log-probs of the response tokens and optionally their statistics, from a packed forward.

    Args:
        module: the policy (transformers or peft causal LM, plain or FSDP2-sharded) on a packed
            attention implementation (:func:`~rlvr.workers.packed_attention.use_packed_attention`).
        batch: ``input_ids``/``attention_mask``/``position_ids [b, P+R]``, ``responses [b, R]``.
        temperature: divides the logits.
        calculate_entropy: also return the entropy of each token's distribution.
        entropy_grad: the entropy carries a gradient (needs the logits head, not ``chunked_head``).
        chunked_head: use the chunked LM head (one unsharded rank, bias-free head).
        sp: the sequence-parallel group (size 1: none).
        calculate_sum_pi_squared: also return ``sum_v p_v^2`` of each token's distribution.
        entropy_chunk: rows per chunk of the entropy (``actor.entropy_from_logits_chunk_size``).
        packed: ``batch`` already packed by :func:`pack_micro_batch` (None: packed here).

    Returns:
        ``{"log_probs": [b, R]}`` plus ``"entropy"`` / ``"sum_pi_squared"`` ``[b, R]`` when asked,
        float32, zero where a row has no response token.
    """
    packed = pack_micro_batch(batch, sp) if packed is None else packed
    labels = packed.local_labels(sp)
    head_input, weight = _head_inputs(module, packed, sp, chunked_head and not (calculate_entropy and entropy_grad))
    if weight is not None:
        stats = linear_token_stats(head_input, weight, labels, temperature, with_entropy=calculate_entropy,
                                   with_sum_pi_squared=calculate_sum_pi_squared)
    else:
        logits = head_input / temperature if temperature != 1.0 else head_input
        stats = logits_token_stats(logits, labels, calculate_entropy, entropy_grad, calculate_sum_pi_squared,
                                   entropy_chunk)
    return {name: packed.unpack(values, sp) for name, values in stats.items()}
