"""One-token attention for grouped-query models without copying the keys and values.

With grouped-query attention (GQA: Ainslie et al. 2023, "GQA: Training Generalized Multi-Query
Transformer Models from Multi-Head Checkpoints", arXiv:2305.13245) ``H`` query heads share ``Hkv``
key/value heads. transformers' SDPA path repeats the keys and values to ``H`` heads whenever there
is a padding mask (and, in some versions, always under ``torch.compile``): at every decode step
that writes and reads ``H / Hkv`` times the whole KV cache (3x for SmolLM2-135M), which dominates
the memory traffic of decoding a large batch.

For one query token the ``G = H / Hkv`` query heads of a group can instead be laid along the
query-length axis: ``[b, H, 1, d] -> [b, Hkv, G, d]``, attended against the cache as it is
(``[b, Hkv, L, d]``) with the padding mask ``[b, 1, 1, L]`` broadcast over the group, and folded
back. The result is the same attention, computed from the cache in place.

:func:`grouped_sdpa_attention` does that for one-token queries and hands everything else to
transformers' SDPA function; it is registered with transformers' attention and mask interfaces as
``"rlvr_sdpa"`` (masks as for ``"sdpa"``), which the static-cache decoder selects while it decodes.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

__all__ = ["GROUPED_SDPA", "grouped_sdpa_attention"]

GROUPED_SDPA = "rlvr_sdpa"


def grouped_sdpa_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                           **kwargs) -> tuple[torch.Tensor, None]:
    """Attention in transformers' interface (``query [b, H, q, d]``, ``key``/``value [b, Hkv, L, d]``,
    ``attention_mask [b, 1, q, L]`` boolean or additive, or None).

    Returns:
        ``(output [b, q, H, d], None)``.
    """
    batch, heads, q_len, dim = query.shape
    kv_heads = key.shape[1]
    if q_len != 1 or heads == kv_heads or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    grouped = query.reshape(batch, kv_heads, heads // kv_heads, dim)
    out = torch.nn.functional.scaled_dot_product_attention(grouped, key, value, attn_mask=attention_mask,
                                                           dropout_p=dropout, scale=scaling)
    return out.reshape(batch, heads, 1, value.shape[-1]).transpose(1, 2).contiguous(), None


AttentionInterface.register(GROUPED_SDPA, grouped_sdpa_attention)
AttentionMaskInterface.register(GROUPED_SDPA, sdpa_mask)
