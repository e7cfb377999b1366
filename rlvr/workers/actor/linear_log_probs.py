"""Log-probs of the labels straight from hidden states: LM head + log-softmax, a few tokens at a time.

``log p(y_i) = z_i[y_i] - logsumexp(z_i)`` with ``z_i = (h_i @ W^T) / temperature``. Computing ``z``
for the whole batch would hold ``tokens x vocab`` logits (12.9 GB in float32 for 256 sequences of
256 tokens and a 49K vocabulary); here the LM head runs on ``chunk`` tokens at a time, their float32
logits are reduced to one log-prob (and optionally one entropy) per token and dropped. The backward
pass recomputes each chunk's logits and accumulates::

    dL/dz_i = g_i * (onehot(y_i) - softmax(z_i)) / temperature
    dL/dh_i = dL/dz_i @ W          dL/dW += dL/dz_i^T @ h_i

so the memory of the head is ``O(chunk x vocab)`` in both directions, whatever the batch. The same
pass can also give, without a gradient, each token's entropy and ``sum_v p_v^2`` (the optimal token
baseline's ``sum_pi_squared``): :func:`linear_token_stats`.
"""

from __future__ import annotations

import torch

__all__ = ["linear_log_probs", "linear_token_stats", "chunk_tokens_for"]

_CHUNK_BYTES = {"cuda": 1 << 30, "cpu": 32 << 20}


def chunk_tokens_for(vocab_size: int, device: torch.device) -> int:
    """Tokens per chunk so that one chunk's float32 logits take about 1 GiB on GPU, 32 MiB on CPU
    (small enough to stay in the CPU's caches between the passes over it)."""
    budget = _CHUNK_BYTES["cuda" if device.type == "cuda" else "cpu"]
    return max(1, budget // (4 * vocab_size))


def _chunk_logits(hidden: torch.Tensor, weight: torch.Tensor, inv_temperature: float) -> torch.Tensor:
    """``[c, vocab]`` float32 logits of a chunk of hidden states ``[c, H]``."""
    logits = (hidden @ weight.t()).float()
    if inv_temperature != 1.0:
        logits.mul_(inv_temperature)
    return logits


class _LinearLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, inv_temperature: float,
                chunk: int, with_entropy: bool, with_sum_pi_squared: bool
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rows = hidden.shape[0]
        log_probs = torch.empty(rows, dtype=torch.float32, device=hidden.device)
        lse = torch.empty(rows, dtype=torch.float32, device=hidden.device)
        entropy = torch.empty(rows if with_entropy else 0, dtype=torch.float32, device=hidden.device)
        sum_pi_squared = torch.empty(rows if with_sum_pi_squared else 0, dtype=torch.float32, device=hidden.device)
        for start in range(0, rows, chunk):
            end = min(start + chunk, rows)
            logits = _chunk_logits(hidden[start:end], weight, inv_temperature)
            # one exp pass gives the log-normaliser and, with a dot product, the entropy
            # H = lse - sum(exp(z - m) * z) / sum(exp(z - m))
            peak = logits.amax(dim=-1, keepdim=True)
            exp = torch.sub(logits, peak).exp_()
            total = exp.sum(dim=-1)
            lse[start:end] = peak.squeeze(-1) + total.log()
            log_probs[start:end] = logits.gather(-1, labels[start:end, None]).squeeze(-1) - lse[start:end]
            if with_entropy:
                entropy[start:end] = lse[start:end] - torch.linalg.vecdot(exp, logits) / total
            if with_sum_pi_squared:  # sum_v p_v^2 = sum_v exp(z_v - m)^2 / (sum_v exp(z_v - m))^2
                sum_pi_squared[start:end] = torch.linalg.vecdot(exp, exp) / total.square()
        ctx.save_for_backward(hidden, weight, labels, lse)
        ctx.inv_temperature, ctx.chunk = inv_temperature, chunk
        ctx.mark_non_differentiable(entropy, sum_pi_squared)
        return log_probs, entropy, sum_pi_squared

    @staticmethod
    def backward(ctx, grad_log_probs: torch.Tensor, _grad_entropy: torch.Tensor, _grad_sum_pi_squared: torch.Tensor):
        hidden, weight, labels, lse = ctx.saved_tensors
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_weight else None
        grad = grad_log_probs.float()
        for start in range(0, hidden.shape[0], ctx.chunk):
            end = min(start + ctx.chunk, hidden.shape[0])
            g = grad[start:end, None]
            # dz = g * (onehot - softmax), built in place of the recomputed logits
            dz = _chunk_logits(hidden[start:end], weight, ctx.inv_temperature)
            dz.sub_(lse[start:end, None]).exp_().mul_(-g)
            dz.scatter_add_(-1, labels[start:end, None], g)
            if ctx.inv_temperature != 1.0:
                dz.mul_(ctx.inv_temperature)
            if need_hidden:
                grad_hidden[start:end] = dz.to(hidden.dtype) @ weight
            if need_weight:
                # float32 accumulation over the chunks (a bf16 sum of chunk products would be biased)
                grad_weight.addmm_(dz.t(), hidden[start:end].float())
        if need_weight:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None, None


def linear_token_stats(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0,
                       chunk: int | None = None, with_entropy: bool = False, with_sum_pi_squared: bool = False
                       ) -> dict[str, torch.Tensor]:
    """Per-token statistics of ``softmax(hidden @ weight.T / temperature)``, chunked over tokens.

    Args:
        hidden: ``[..., H]`` final hidden states (the LM head's input).
        weight: ``[vocab, H]`` LM-head weight (no bias).
        labels: ``[...]`` token ids (same leading shape as ``hidden``).
        temperature: divides the logits.
        chunk: tokens per chunk (default :func:`chunk_tokens_for`).
        with_entropy: also return each token's entropy (no gradient).
        with_sum_pi_squared: also return each token's ``sum_v p_v^2`` (no gradient).

    Returns:
        ``{"log_probs": [...]}`` plus ``"entropy"`` / ``"sum_pi_squared"`` when asked, float32;
        gradients flow to ``hidden`` and ``weight`` through ``log_probs``.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    lead = labels.shape
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    flat_labels = labels.reshape(-1).long()
    chunk = chunk or chunk_tokens_for(weight.shape[0], hidden.device)
    log_probs, entropy, sum_pi_squared = _LinearLogProbs.apply(flat_hidden, weight, flat_labels, 1.0 / temperature,
                                                               chunk, with_entropy, with_sum_pi_squared)
    stats = {"log_probs": log_probs.reshape(lead)}
    if with_entropy:
        stats["entropy"] = entropy.reshape(lead)
    if with_sum_pi_squared:
        stats["sum_pi_squared"] = sum_pi_squared.reshape(lead)
    return stats


def linear_log_probs(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0,
                     chunk: int | None = None, with_entropy: bool = False
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of each label under ``softmax(hidden @ weight.T / temperature)``, chunked over tokens
    (and the entropy): :func:`linear_token_stats` as ``(log_probs [...], entropy [...] or None)``."""
    stats = linear_token_stats(hidden, weight, labels, temperature, chunk, with_entropy)
    return stats["log_probs"], stats.get("entropy")
