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

A mixture-of-experts policy's routers see the forward in its two segments (the prompts, then the
responses): the caller plans the sharing first (:func:`prompt_sharing`), arms the routers for it
(:class:`~rlvr.workers.moe.layout.SharedPromptLayout`) and passes ``on_segment``, and the response
segment then also runs the window's last column, so the routers see every token the plain forward
runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from rlvr.utils.multimodal import MultiModalRows, image_row_keys, model_inputs, position_offsets
from rlvr.workers.batching import distinct_prompts
from rlvr.workers.kv_cache import select_cache_rows
from rlvr.workers.models import unwrap_hf_model

__all__ = ["PromptSharing", "prompt_sharing", "shared_prompt_hidden"]


def _uses_gradient_checkpointing(module: nn.Module) -> bool:
    """Training with activation checkpointing (transformers 5.20+ names it ``is_activation_checkpointing``,
    earlier versions ``is_gradient_checkpointing``)."""
    model = unwrap_hf_model(module)
    name = "is_activation_checkpointing" if hasattr(type(model), "is_activation_checkpointing") \
        else "is_gradient_checkpointing"
    return module.training and bool(getattr(model, name, False))


def _distinct(input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int,
              multi_modal: MultiModalRows | None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`distinct_prompts` of the prompt columns; rows with the same ids but other images differ."""
    ids, mask = input_ids[:, :prompt_len], attention_mask[:, :prompt_len]
    if multi_modal is not None:
        ids = torch.cat([ids, image_row_keys(multi_modal).to(ids.device)[:, None]], dim=1)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
    return distinct_prompts(ids, mask)


@dataclass(frozen=True)
class PromptSharing:
    """The distinct prompts of a micro-batch (:func:`~rlvr.workers.batching.distinct_prompts`).

    Attributes:
        first: ``[u]`` the first row of each distinct prompt.
        inverse: ``[b]`` each row's distinct prompt (an index into ``first``).
    """

    first: torch.Tensor
    inverse: torch.Tensor


def prompt_sharing(module: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int,
                   multi_modal: MultiModalRows | None = None) -> PromptSharing | None:
    """The micro-batch's distinct prompts, or None where :func:`shared_prompt_hidden` cannot or need
    not share them: no prompt occurs twice, the model recomputes activations (gradient checkpointing)
    or images sit in the responses (an environment's observations).

    Args:
        input_ids, attention_mask: ``[b, prompt_len + num_response]`` (as :func:`shared_prompt_hidden`'s).
    """
    first, inverse = _distinct(input_ids, attention_mask, prompt_len, multi_modal)
    if first.numel() == input_ids.shape[0] or _uses_gradient_checkpointing(module):
        return None
    image_token = getattr(unwrap_hf_model(module).config, "image_token_id", None)
    if multi_modal is not None and bool((input_ids[:, prompt_len:] == image_token).any()):
        return None
    return PromptSharing(first, inverse)


def shared_prompt_hidden(module: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         position_ids: torch.Tensor, prompt_len: int, num_response: int,
                         multi_modal: MultiModalRows | None = None, sharing: PromptSharing | None = None,
                         on_segment: Callable[[int], None] | None = None) -> torch.Tensor | None:
    """Final hidden states that predict response tokens ``0..num_response-1``, running each distinct
    prompt once (see the module docstring).

    Args:
        module: a transformers (or peft) causal LM, not sharded.
        input_ids, attention_mask, position_ids: ``[b, prompt_len + num_response]``: left-padded
            prompts (the last prompt column is a real token in every row) then the responses.
        prompt_len: prompt columns.
        num_response: response columns whose tokens are predicted (``>= 1``).
        multi_modal: the rows' images (:mod:`rlvr.utils.multimodal`); a prompt is its ids and its
            images, and the responses go on from the prompt's (M-RoPE) positions.
        sharing: the plan of :func:`prompt_sharing`, made by the caller (None: made here).
        on_segment: called with 0 before the prompts run and with 1 before the responses run (a
            mixture-of-experts policy's routers, module docstring); the response segment then runs
            all ``num_response`` columns, the last one too, although its output predicts nothing.

    Returns:
        ``[b, num_response, H]``, the same as the base model's ``last_hidden_state[:, prompt_len - 1 :
        prompt_len + num_response - 1]`` on the whole sequences; None when :func:`prompt_sharing`
        finds nothing to share (then nothing is saved, or the cache is unavailable, and the caller
        runs the plain forward).
    """
    sharing = sharing or prompt_sharing(module, input_ids, attention_mask, prompt_len, multi_modal)
    if sharing is None:
        return None
    model = unwrap_hf_model(module)
    first, inverse = sharing.first, sharing.inverse
    decoder = model.base_model  # a text model's decoder; a VLM's decoder with its vision encoder
    prompt_inputs = model_inputs(model, input_ids[first, :prompt_len], attention_mask[first, :prompt_len],
                                 position_ids[first, :prompt_len], None if multi_modal is None else multi_modal[first])
    if on_segment is not None:
        on_segment(0)
    prompt_out = decoder(**prompt_inputs, use_cache=True)
    last_prompt = prompt_out.last_hidden_state[:, -1:].index_select(0, inverse)
    run = num_response if on_segment is not None else num_response - 1  # response columns to run
    if run == 0:
        return last_prompt
    cache = prompt_out.past_key_values
    select_cache_rows(cache, inverse)
    stop = prompt_len + run
    offsets = position_offsets(prompt_inputs).index_select(0, inverse)  # 0 without M-RoPE
    if on_segment is not None:
        on_segment(1)
    response_out = decoder(input_ids=input_ids[:, prompt_len:stop], attention_mask=attention_mask[:, :stop],
                           position_ids=position_ids[:, prompt_len:stop] + offsets[:, None], past_key_values=cache,
                           use_cache=True)
    return torch.cat([last_prompt, response_out.last_hidden_state[:, : num_response - 1]], dim=1)
