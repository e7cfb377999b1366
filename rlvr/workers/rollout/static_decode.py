"""Forward passes of the decode loop, with a growing or a static KV cache (the GPU fast path).

:class:`DynamicCacheDecoder` is the plain transformers path: the KV cache grows by one column per
step, the attention mask is concatenated every step. Simple, any shape, but every step launches
each kernel of the model separately and re-allocates the cache.

:class:`StaticCacheDecoder` preallocates a transformers ``StaticCache`` of ``max_cache_len``
columns (``rollout.prompt_length + rollout.response_length``) once per batch size and keeps it
between calls, so every decode step has the same shapes and tensor addresses: one-token input
``[b, 1]``, a constant attention mask ``[b, max_cache_len]`` (prompt padding 0, every later column
1; the causal mask hides the columns not written yet). With ``compile`` the step is compiled with
``torch.compile`` (``mode="reduce-overhead"`` on CUDA: the whole step is replayed as one CUDA graph).
The prompt (prefill) always runs eagerly: its width changes from batch to batch. While it decodes,
a model on transformers' ``"sdpa"`` attention uses :mod:`~rlvr.workers.rollout.gqa_attention`
instead (same attention, grouped-query heads without copying the KV cache every step).

Both decoders offer ``prefill(input_ids, attention_mask, position_ids, **image_inputs) -> logits [b, vocab]``,
``step(tokens [b], position_ids [b]) -> logits [b, vocab]`` and ``sample_step(tokens, position_ids,
params, uniform) -> (tokens [b], log_probs [b])``, the step followed by
:func:`~rlvr.workers.rollout.sampling.sample_with_uniform` (the random numbers ``uniform`` drawn by the
caller), for the sampling loop of :class:`~rlvr.workers.rollout.hf_rollout.HFRollout`; ``finish()``
ends a generation call. With ``compile`` the static decoder compiles the model step *and* the
sampling as one function, so on CUDA one graph replay runs both (only the generator draw, which
``torch.compile`` cannot take, and the loop's bookkeeping stay eager).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import StaticCache

from rlvr.workers.kv_cache import select_cache_rows
from rlvr.workers.rollout.gqa_attention import GROUPED_SDPA
from rlvr.workers.rollout.sampling import SamplingParams, sample_with_uniform

__all__ = ["DynamicCacheDecoder", "StaticCacheDecoder"]


def _text_config(module: nn.Module):
    """Config of the (possibly peft-wrapped) causal LM: what ``StaticCache`` sizes its layers by."""
    config = module.config
    return config.get_text_config(decoder=True)


class DynamicCacheDecoder:
    """Decoding with transformers' default growing cache (see the module docstring)."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self._cache = None
        self._mask: torch.Tensor | None = None

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                **image_inputs: torch.Tensor) -> torch.Tensor:
        """Run the prompt ``[b, P]`` (no all-padding columns; ``image_inputs`` of a vision-language
        model); returns next-token logits ``[b, vocab]``."""
        out = self.module(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          use_cache=True, logits_to_keep=1, **image_inputs)
        self._cache, self._mask = out.past_key_values, attention_mask
        return out.logits[:, -1]

    def step(self, tokens: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """Feed one token per row (``[b]``) at ``position_ids`` (``[b]``); returns logits ``[b, vocab]``."""
        assert self._mask is not None, "prefill() must run before step()"
        self._mask = torch.cat([self._mask, torch.ones_like(self._mask[:, :1])], dim=1)
        out = self.module(input_ids=tokens[:, None], attention_mask=self._mask, position_ids=position_ids[:, None],
                          past_key_values=self._cache, use_cache=True)
        self._cache = out.past_key_values
        return out.logits[:, -1]

    def sample_step(self, tokens: torch.Tensor, position_ids: torch.Tensor, params: SamplingParams,
                    uniform: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`step`, then the next token of each row: ``(tokens [b], log_probs [b])`` of
        :func:`~rlvr.workers.rollout.sampling.sample_with_uniform` for the draws ``uniform``."""
        return sample_with_uniform(self.step(tokens, position_ids), params, uniform)

    def select_rows(self, rows: torch.Tensor) -> None:
        """Make row ``i`` of the prefilled cache a copy of its row ``rows[i]`` (``rows`` ``[b']`` long),
        so a prompt that occurs several times in the batch is prefilled once."""
        assert self._cache is not None and self._mask is not None, "prefill() must run before select_rows()"
        select_cache_rows(self._cache, rows)
        self._mask = self._mask[rows]

    def finish(self) -> None:
        """Drop the cache of this call."""
        self._cache = self._mask = None

    def free(self) -> None:
        """Nothing is kept between calls."""
        self.finish()


class StaticCacheDecoder:
    """Decoding with a preallocated ``StaticCache`` and an optionally compiled step.

    Args:
        module: the causal LM (shared with the actor or owned by the engine).
        max_cache_len: cache columns: longest prompt plus ``response_length``.
        compile: ``torch.compile`` the one-token step (CUDA graphs on GPU).
    """

    def __init__(self, module: nn.Module, max_cache_len: int, compile: bool) -> None:
        self.module = module
        self.max_cache_len = int(max_cache_len)
        self._caches: dict[int, StaticCache] = {}
        self._cache: StaticCache | None = None
        self._mask: torch.Tensor | None = None
        self._compiled = compile
        self._restore_attention: str | None = None
        self._graphs = compile and next(module.parameters()).is_cuda  # outputs live in CUDA-graph memory
        self._step_fn = self._forward_one
        self._sample_step_fn = self._forward_and_sample
        if compile:
            mode = "reduce-overhead" if self._graphs else "default"
            self._step_fn = torch.compile(self._forward_one, mode=mode, dynamic=False)
            self._sample_step_fn = torch.compile(self._forward_and_sample, mode=mode, dynamic=False)

    def _forward_one(self, tokens: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor,
                     cache: StaticCache) -> torch.Tensor:
        out = self.module(input_ids=tokens, attention_mask=attention_mask, position_ids=position_ids,
                          past_key_values=cache, use_cache=True)
        return out.logits[:, -1].float()

    def _forward_and_sample(self, tokens: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor,
                            cache: StaticCache, params: SamplingParams, uniform: torch.Tensor | None
                            ) -> tuple[torch.Tensor, torch.Tensor]:
        """One model step and the sampling of its logits: the function compiled into one CUDA graph."""
        return sample_with_uniform(self._forward_one(tokens, position_ids, attention_mask, cache), params, uniform)

    def _use_grouped_attention(self) -> None:
        """Switch an ``"sdpa"`` model to the grouped one-token attention until :meth:`finish`."""
        config = self.module.config
        if config._attn_implementation == "sdpa":
            config._attn_implementation = GROUPED_SDPA
            self._restore_attention = "sdpa"

    def _cache_for(self, rows: int) -> StaticCache:
        """The cache for ``rows`` sequences, created once and zeroed (in place) for every reuse."""
        cache = self._caches.get(rows)
        if cache is None:
            cache = StaticCache(config=_text_config(self.module), max_cache_len=self.max_cache_len)
            self._caches[rows] = cache
        else:
            cache.reset()
        return cache

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                **image_inputs: torch.Tensor) -> torch.Tensor:
        """Run the prompt ``[b, P]`` (and the ``image_inputs`` of a vision-language model) into cache
        columns ``0..P-1``; returns logits ``[b, vocab]``.

        Raises:
            ValueError: the prompt leaves fewer than one free column in the cache.
        """
        rows, width = input_ids.shape
        if width >= self.max_cache_len:
            raise ValueError(
                f"a prompt batch {width} tokens wide does not fit the static KV cache of {self.max_cache_len} "
                "columns (rollout.prompt_length + rollout.response_length); raise rollout.prompt_length to "
                "the longest prompt (data.max_prompt_length)"
            )
        self._cache = self._cache_for(rows)
        self._use_grouped_attention()
        free = attention_mask.new_ones(rows, self.max_cache_len - width)
        self._mask = torch.cat([attention_mask, free], dim=1)
        out = self.module(input_ids=input_ids, attention_mask=self._mask, position_ids=position_ids,
                          past_key_values=self._cache, use_cache=True, logits_to_keep=1, **image_inputs)
        return out.logits[:, -1]

    def step(self, tokens: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """Feed one token per row (``[b]``) at ``position_ids`` (``[b]``); returns logits ``[b, vocab]``.

        With ``compile`` on CUDA the returned tensor lives in the CUDA graph's memory and is
        overwritten by the next step: use it before calling ``step`` again.
        """
        assert self._cache is not None and self._mask is not None, "prefill() must run before step()"
        if self._compiled:
            torch.compiler.cudagraph_mark_step_begin()
        return self._step_fn(tokens[:, None], position_ids[:, None], self._mask, self._cache)

    def sample_step(self, tokens: torch.Tensor, position_ids: torch.Tensor, params: SamplingParams,
                    uniform: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed one token per row (``[b]``) at ``position_ids`` (``[b]``) and sample the next one:
        ``(tokens [b] int64, log_probs [b] float32)`` of
        :func:`~rlvr.workers.rollout.sampling.sample_with_uniform` for the draws ``uniform``
        (``[b, 1]`` float64, None when greedy). With ``compile`` the model step and the sampling are
        one compiled function (one CUDA graph on GPU, whose outputs are copied out before they are
        returned, since the next replay overwrites them).
        """
        assert self._cache is not None and self._mask is not None, "prefill() must run before sample_step()"
        if self._compiled:
            torch.compiler.cudagraph_mark_step_begin()
        next_tokens, log_probs = self._sample_step_fn(tokens[:, None], position_ids[:, None], self._mask, self._cache,
                                                      params, uniform)
        if self._graphs:
            return next_tokens.clone(), log_probs.clone()
        return next_tokens, log_probs

    def finish(self) -> None:
        """End a call (the model's attention setting is restored); the cache stays allocated for the
        next call with the same batch size."""
        self._cache = self._mask = None
        if self._restore_attention is not None:
            self.module.config._attn_implementation = self._restore_attention
            self._restore_attention = None

    def free(self) -> None:
        """Release every cache (``rollout.free_cache_engine``); the next call allocates again."""
        self.finish()
        self._caches.clear()
