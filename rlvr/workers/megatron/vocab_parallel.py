"""Log-probs and entropy from vocabulary-parallel logits, without gathering the full logits.

Each tensor-parallel rank holds the logits of its slice of the vocabulary, ``z[:, start:end]``.
With ``lse = log sum_j exp(z_j)`` and ``p = softmax(z)``::

    log p(y) = z_y - lse                      H = lse - sum_j p_j z_j

are built from three per-token all-reduces over the tensor-parallel group (the maximum for a stable
``lse``, the sum of ``exp``, the target logit, and for the entropy ``sum_j exp(z_j - m) z_j``; for
``sum_j p_j^2`` also ``sum_j exp(z_j - m)^2``, without a gradient), so
each rank keeps ``[tokens, vocab / tp]`` and exchanges ``[tokens]``. The backward pass needs no
communication: the gradient of a slice of logits only involves that slice and the reduced values::

    d log p(y) / dz_j = onehot_y(j) - p_j          dH / dz_j = -p_j (log p_j + H)

Columns past the real vocabulary (padding to a multiple of ``tp``) are left out of every sum.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["vocab_parallel_log_probs", "vocab_parallel_token_stats"]


def _all_reduce(value: torch.Tensor, op: dist.ReduceOp, group) -> torch.Tensor:
    if group is not None:
        dist.all_reduce(value, op=op, group=group)
    return value


class _VocabParallelLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, vocab_start: int, group, with_entropy: bool,
                with_sum_pi_squared: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        local = labels - vocab_start
        on_rank = (local >= 0) & (local < logits.shape[-1])
        peak = _all_reduce(logits.amax(dim=-1), dist.ReduceOp.MAX, group)
        exp = (logits - peak[:, None]).exp_()
        sums = [exp.sum(dim=-1)]
        target = logits.gather(-1, local.clamp(0, logits.shape[-1] - 1)[:, None]).squeeze(-1)
        sums.append(torch.where(on_rank, target, torch.zeros_like(target)))
        if with_entropy:
            sums.append(torch.linalg.vecdot(exp, logits))
        if with_sum_pi_squared:
            sums.append(torch.linalg.vecdot(exp, exp))
        reduced = _all_reduce(torch.stack(sums), dist.ReduceOp.SUM, group)
        lse = peak + reduced[0].log()
        log_probs = reduced[1] - lse
        empty = torch.empty(0, device=logits.device)
        entropy = lse - reduced[2] / reduced[0] if with_entropy else empty
        sum_pi_squared = reduced[-1] / reduced[0].square() if with_sum_pi_squared else empty.clone()
        ctx.save_for_backward(logits, local, on_rank, lse, entropy)
        ctx.mark_non_differentiable(sum_pi_squared)
        return log_probs, entropy, sum_pi_squared

    @staticmethod
    def backward(ctx, grad_log_probs: torch.Tensor, grad_entropy: torch.Tensor, _grad_sum_pi_squared: torch.Tensor):
        logits, local, on_rank, lse, entropy = ctx.saved_tensors
        log_p = logits - lse[:, None]
        probs = log_p.exp()
        grad = probs * -grad_log_probs[:, None]
        rows = on_rank.nonzero().squeeze(-1)
        grad[rows, local[rows]] += grad_log_probs[rows]
        if entropy.numel() and grad_entropy is not None:
            grad -= grad_entropy[:, None] * probs * (log_p + entropy[:, None])
        return grad, None, None, None, None, None


def vocab_parallel_token_stats(logits: torch.Tensor, labels: torch.Tensor, vocab_start: int, vocab_size: int,
                               group=None, temperature: float = 1.0, with_entropy: bool = False,
                               with_sum_pi_squared: bool = False) -> dict[str, torch.Tensor]:
    """Log-prob of each label (and the entropy, and ``sum_j p_j^2``) under
    ``softmax(logits / temperature)`` over the whole vocabulary, from this rank's slice of the logits.

    Args:
        logits: ``[..., local_vocab]`` this rank's logits, vocabulary ids
            ``vocab_start ... vocab_start + local_vocab - 1`` (ids ``>= vocab_size`` are padding).
        labels: ``[...]`` token ids (global vocabulary ids).
        vocab_start: the first vocabulary id of this rank's slice.
        vocab_size: the real vocabulary size.
        group: the tensor-parallel process group (None: one rank holds the whole vocabulary).
        temperature: divides the logits.
        with_entropy: also return the entropy of each token's distribution (differentiable).
        with_sum_pi_squared: also return ``sum_j p_j^2`` of each token's distribution (no gradient).

    Returns:
        ``{"log_probs": [...]}`` plus ``"entropy"`` / ``"sum_pi_squared"`` when asked, float32;
        ``log_probs`` and ``entropy`` are differentiable with respect to ``logits``.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    valid = max(0, min(logits.shape[-1], vocab_size - vocab_start))
    if valid == 0:
        raise ValueError(f"this rank's vocabulary slice starts at {vocab_start}, past the vocabulary ({vocab_size})")
    z = logits[..., :valid].float()
    if temperature != 1.0:
        z = z / temperature
    lead = labels.shape
    log_probs, entropy, sum_pi_squared = _VocabParallelLogProbs.apply(
        z.reshape(-1, valid), labels.reshape(-1).long(), vocab_start, group, with_entropy, with_sum_pi_squared)
    stats = {"log_probs": log_probs.reshape(lead)}
    if with_entropy:
        stats["entropy"] = entropy.reshape(lead)
    if with_sum_pi_squared:
        stats["sum_pi_squared"] = sum_pi_squared.reshape(lead)
    return stats


def vocab_parallel_log_probs(logits: torch.Tensor, labels: torch.Tensor, vocab_start: int, vocab_size: int,
                             group=None, temperature: float = 1.0, with_entropy: bool = False
                             ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`vocab_parallel_token_stats` as ``(log_probs [...], entropy [...] or None)``."""
    stats = vocab_parallel_token_stats(logits, labels, vocab_start, vocab_size, group, temperature, with_entropy)
    return stats["log_probs"], stats.get("entropy")
