"""Per-token statistics of the policy from full logits: the log-prob of the sampled token and,
when asked, the entropy and ``sum_v p_v^2`` of the token's distribution.

The actor's forward paths return these as a dict (``log_probs``, ``entropy``, ``sum_pi_squared``);
the chunked LM head computes the same without holding the logits
(:func:`~rlvr.workers.actor.linear_log_probs.linear_token_stats`).
"""

from __future__ import annotations

import torch

from rlvr.utils.torch_functional import (
    DEFAULT_CHUNK_ROWS,
    calculate_sum_pi_squared_from_logits,
    entropy_from_logits,
    logprobs_from_logits,
)

__all__ = ["logits_token_stats"]


def logits_token_stats(logits: torch.Tensor, labels: torch.Tensor, calculate_entropy: bool, entropy_grad: bool,
                       calculate_sum_pi_squared: bool = False, entropy_chunk: int = DEFAULT_CHUNK_ROWS
                       ) -> dict[str, torch.Tensor]:
    """Statistics of ``softmax(logits)`` at each position.

    Args:
        logits: ``[..., vocab]`` (already divided by the temperature).
        labels: ``[...]`` the sampled token ids.
        calculate_entropy: also return ``entropy [...]``.
        entropy_grad: the entropy carries a gradient (else it is computed without one).
        calculate_sum_pi_squared: also return ``sum_pi_squared [...]`` (no gradient).
        entropy_chunk: rows per chunk of the entropy (``actor.entropy_from_logits_chunk_size``).

    Returns:
        ``{"log_probs": [...]}`` (with its gradient) plus the statistics asked for.
    """
    stats = {"log_probs": logprobs_from_logits(logits, labels)}
    if calculate_entropy and entropy_grad:
        stats["entropy"] = entropy_from_logits(logits, entropy_chunk)
    with torch.no_grad():
        if calculate_entropy and not entropy_grad:
            stats["entropy"] = entropy_from_logits(logits.detach(), entropy_chunk)
        if calculate_sum_pi_squared:
            stats["sum_pi_squared"] = calculate_sum_pi_squared_from_logits(logits.detach().float())
    return stats
