"""KV-cache row selection: copy a prompt's cache rows out to the rows of its responses.

Used where a repeated prompt runs once (the rollout's prefill and the actor's shared-prompt forward,
see :func:`rlvr.workers.batching.distinct_prompts`) and its keys and values then serve every row
that holds that prompt.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer

__all__ = ["select_cache_rows"]


def select_cache_rows(cache: Cache, rows: torch.Tensor) -> None:
    """Keep, in place, cache rows ``rows`` (``[b]`` indices into the cache's batch dimension; repeats
    allowed) with a deterministic backward.

    Every layer that selects rows as transformers' ``DynamicLayer`` does (sliding-window layers
    included; keys and values ``[u, heads, seq, head_dim]`` -> ``[b, heads, seq, head_dim]``) is
    selected with ``index_select``; a layer with its own selection (quantized, indexed, ...) keeps
    its ``batch_select_indices``, which is correct but, for gradients on CPU, not bit-reproducible: its advanced indexing has an
    ``index_put_(accumulate=True)`` backward whose threads add into a shared row in a varying order.
    """
    for layer in cache.layers:
        plain = type(layer).batch_select_indices is DynamicLayer.batch_select_indices
        if plain and layer.keys is not None and layer.keys.numel() > 0:
            layer.keys = layer.keys.index_select(0, rows)
            layer.values = layer.values.index_select(0, rows)
        else:
            layer.batch_select_indices(rows)
