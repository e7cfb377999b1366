"""Run each distinct prompt of a micro-batch through the model once, with gradients.

GRPO-style batches hold every prompt ``n`` times (``rollout.n`` responses each). A plain forward
pass computes the prompt's hidden states, keys and values ``n`` times over, and on CPU that is most
of the update's cost (a 90-token prompt with 15-token responses spends 86% of the forward on the
prompt). Here the distinct prompts run once, with ``use_cache=True``; the KV cache is indexed out to
one row per sequence and the responses run on top of it. Indexing is differentiable (its backward
adds the ``n`` rows' gradients back into the one prompt row), so log-probs and gradients equal the
plain forward's up to float rounding: nothing is approximated or detached.

Rows are copied out with ``index_select`` (:func:`~rlvr.workers.kv_cache.select_cache_rows` for the
cache), never with advanced indexing (``t[rows]``): on CPU the backward of advanced indexing is
``index_put_(accumulate=True)``, which with more than one thread adds with atomics in whatever order
the threads reach a row, so two runs of one seed drift apart by float rounding. ``index_select``'s
backward (``index_add_``) adds the rows in index order.

The caller must use the result only where the model's forward is a standard transformers decoder
that accepts ``past_key_values`` (every causal LM of transformers does); with gradient
checkpointing transformers turns the cache off in training, so :func:`shared_prompt_hidden` then
returns None and the caller runs the plain forward.
"""

from __future__ import annotations

import torch
from torch import nn

from rlvr.workers.batching import distinct_prompts
from rlvr.workers.kv_cache import select_cache_rows
from rlvr.workers.models import unwrap_hf_model

__all__ = ["shared_prompt_hidden"]


def _uses_gradient_checkpointing(module: nn.Module) -> bool:
    """Training with activation checkpointing (transformers 5.20+ names it ``is_activation_checkpointing``,
    earlier versions ``is_gradient_checkpointing``)."""
    model = unwrap_hf_model(module)
    name = "is_activation_checkpointing" if hasattr(type(model), "is_activation_checkpointing") \
        else "is_gradient_checkpointing"
    return module.training and bool(getattr(model, name, False))


def shared_prompt_hidden(module: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         position_ids: torch.Tensor, prompt_len: int, num_response: int) -> torch.Tensor | None:
    """Final hidden states that predict response tokens ``0..num_response-1``, running each distinct
    prompt once (see the module docstring).

    Args:
        module: a transformers (or peft) causal LM, not sharded.
        input_ids, attention_mask, position_ids: ``[b, prompt_len + num_response]``: left-padded
            prompts (the last prompt column is a real token in every row) then the responses.
        prompt_len: prompt columns.
        num_response: response columns whose tokens are predicted (``>= 1``).

    Returns:
        ``[b, num_response, H]``, the same as the decoder's ``last_hidden_state[:, prompt_len - 1 :
        prompt_len + num_response - 1]`` on the whole sequences; None when no prompt occurs twice or
        the model recomputes activations (gradient checkpointing): then nothing is saved, or the
        cache is unavailable, and the caller runs the plain forward.
    """
    first, inverse = distinct_prompts(input_ids[:, :prompt_len], attention_mask[:, :prompt_len])
    if first.numel() == input_ids.shape[0] or _uses_gradient_checkpointing(module):
        return None
    decoder = unwrap_hf_model(module).get_decoder()
    prompt_out = decoder(input_ids=input_ids[first, :prompt_len], attention_mask=attention_mask[first, :prompt_len],
                         position_ids=position_ids[first, :prompt_len], use_cache=True)
    last_prompt = prompt_out.last_hidden_state[:, -1:].index_select(0, inverse)
    if num_response == 1:
        return last_prompt
    cache = prompt_out.past_key_values
    select_cache_rows(cache, inverse)
    stop = prompt_len + num_response - 1
    response_out = decoder(input_ids=input_ids[:, prompt_len:stop], attention_mask=attention_mask[:, :stop],
                           position_ids=position_ids[:, prompt_len:stop], past_key_values=cache, use_cache=True)
    return torch.cat([last_prompt, response_out.last_hidden_state], dim=1)
