"""Values of the response positions from a packed forward of the critic (``critic.model.use_remove_padding``).

The micro-batch runs as one packed row (:mod:`rlvr.workers.packing`; on this rank's slice under
Ulysses sequence parallelism), and the value of response token ``t`` is read, as in the padded
path, from the position that predicts it; the values go back to the ``[b, response_len]`` layout.
"""

from __future__ import annotations

import torch

from rlvr.workers.actor.packed_log_probs import pack_micro_batch
from rlvr.workers.models import CriticModel
from rlvr.workers.packed_attention import packed_forward
from rlvr.workers.ulysses import SequenceParallel

__all__ = ["packed_values"]


def packed_values(module: CriticModel, batch: dict[str, torch.Tensor], sp: SequenceParallel) -> torch.Tensor:
    """Values ``[b, R]`` (float32, zero where a row has no response token).

    Args:
        module: the critic (plain or FSDP2-sharded) on a packed attention implementation.
        batch: ``input_ids``/``attention_mask``/``position_ids [b, P+R]``, ``responses [b, R]``.
        sp: the sequence-parallel group (size 1: none).
    """
    packed = pack_micro_batch(batch, sp)
    inputs = packed.model_inputs(sp)
    with packed_forward():
        values = module(inputs.pop("input_ids"), inputs.pop("attention_mask"), inputs.pop("position_ids"), **inputs)
    return packed.unpack(values[0].index_select(0, packed.local_response_positions(sp)), sp)
