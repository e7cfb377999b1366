"""Tensor helpers shared by the algorithms and the workers: masked statistics, log-probs and
entropy from logits (chunked, float32), masks and position ids.

All functions are pure torch and work on any device.
"""

from __future__ import annotations

import torch

__all__ = [
    "masked_sum",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "logprobs_from_logits",
    "entropy_from_logits",
    "compute_position_ids",
    "get_response_mask",
    "pad_to_length",
]

DEFAULT_CHUNK_ROWS = 512


# ----------------------------------------------------------------------------- masked statistics
def masked_sum(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is non-zero (weighted by ``mask``).

    Masked-out positions contribute exactly 0, even if they hold ``nan`` or ``inf``.

    Args:
        values: ``[batch, seq_len]`` (any shape broadcastable with ``mask``).
        mask: same shape, 1 for valid positions, 0 elsewhere (bool, int or float).
        axis: dimension to reduce; None reduces everything to a scalar.
    """
    weighted = torch.where(mask.bool(), values * mask, torch.zeros((), dtype=values.dtype, device=values.device))
    return weighted.sum() if axis is None else weighted.sum(dim=axis)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Mean of ``values`` over the positions where ``mask`` is 1.

    Args:
        values: ``[batch, seq_len]``.
        mask: ``[batch, seq_len]`` of 0/1.
        axis: dimension to reduce (e.g. ``-1`` gives ``[batch]``); None gives a scalar.

    Returns:
        The masked mean; 0 where the mask is all zero (no ``nan``).
    """
    count = mask.sum() if axis is None else mask.sum(dim=axis)
    return masked_sum(values, mask, axis) / count.clamp_min(1e-8)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``values`` over all positions where ``mask`` is 1 (a scalar).

    Args:
        values: ``[batch, seq_len]``.
        mask: ``[batch, seq_len]`` of 0/1.
        unbiased: apply Bessel's correction ``n / (n - 1)``.

    Raises:
        ValueError: the mask is empty, or ``unbiased`` with a single valid position.
    """
    count = mask.sum()
    if count == 0:
        raise ValueError("masked_var: the mask selects no element, the variance is undefined")
    mean = masked_mean(values, mask)
    variance = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        if count == 1:
            raise ValueError(
                "masked_var: the mask selects one element, the unbiased variance divides by zero; "
                "use unbiased=False or a larger batch"
            )
        variance = variance * (count / (count - 1))
    return variance


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """Normalise ``values`` to zero mean and unit variance over the masked positions.

    ``(values - mean) / sqrt(var + 1e-8)`` with the masked mean and unbiased masked variance;
    with ``shift_mean=False`` the mean is added back (only the scale changes). Positions outside
    the mask are transformed too but carry no meaning.

    Args:
        values: ``[batch, seq_len]``.
        mask: ``[batch, seq_len]`` of 0/1.

    Returns:
        ``[batch, seq_len]``.
    """
    mean = masked_mean(values, mask)
    variance = masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(variance + 1e-8)
    return whitened if shift_mean else whitened + mean


# ----------------------------------------------------------------------------- log-probs and entropy
def _row_chunks(rows: int, chunk_size: int) -> list[tuple[int, int]]:
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    return [(start, min(start + chunk_size, rows)) for start in range(0, rows, chunk_size)]


class _ChunkedLogProbs(torch.autograd.Function):
    """``log_softmax(logits)[label]`` in float32, one chunk of rows at a time.

    Only the input logits (in their own dtype) and the per-row log-sum-exp ``[rows]`` are kept
    for backward; the float32 softmax is recomputed chunk by chunk there.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, chunk_size: int) -> torch.Tensor:
        rows = logits.shape[0]
        out = torch.empty(rows, dtype=torch.float32, device=logits.device)
        lse = torch.empty(rows, dtype=torch.float32, device=logits.device)
        for start, end in _row_chunks(rows, chunk_size):
            chunk = logits[start:end].float()
            lse[start:end] = torch.logsumexp(chunk, dim=-1)
            out[start:end] = chunk.gather(-1, labels[start:end, None]).squeeze(-1) - lse[start:end]
        ctx.save_for_backward(logits, labels, lse)
        ctx.chunk_size = chunk_size
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        logits, labels, lse = ctx.saved_tensors
        grad = torch.empty_like(logits)
        for start, end in _row_chunks(logits.shape[0], ctx.chunk_size):
            g = grad_out[start:end, None].float()
            # d logp[label] / d z = onehot(label) - softmax(z), built in place in one fp32 chunk
            chunk_grad = logits[start:end].to(torch.float32, copy=True)
            chunk_grad.sub_(lse[start:end, None]).exp_().mul_(-g)
            chunk_grad.scatter_add_(-1, labels[start:end, None], g)
            grad[start:end] = chunk_grad.to(logits.dtype)
        return grad, None, None


class _ChunkedEntropy(torch.autograd.Function):
    """Entropy of ``softmax(logits)`` in float32, one chunk of rows at a time.

    ``H = logsumexp(z) - sum_i p_i z_i``; its gradient ``dH/dz_j = -p_j (log p_j + H)`` is
    recomputed chunk by chunk in backward.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, chunk_size: int) -> torch.Tensor:
        rows = logits.shape[0]
        entropy = torch.empty(rows, dtype=torch.float32, device=logits.device)
        lse = torch.empty(rows, dtype=torch.float32, device=logits.device)
        for start, end in _row_chunks(rows, chunk_size):
            chunk = logits[start:end].float()
            lse[start:end] = torch.logsumexp(chunk, dim=-1)
            probs = torch.softmax(chunk, dim=-1)
            entropy[start:end] = lse[start:end] - (probs * chunk).sum(dim=-1)
        ctx.save_for_backward(logits, lse, entropy)
        ctx.chunk_size = chunk_size
        return entropy

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: torch.Tensor) -> tuple[torch.Tensor, None]:
        logits, lse, entropy = ctx.saved_tensors
        grad = torch.empty_like(logits)
        for start, end in _row_chunks(logits.shape[0], ctx.chunk_size):
            log_probs = logits[start:end].to(torch.float32, copy=True).sub_(lse[start:end, None])
            neg_probs = log_probs.exp().neg_()
            log_probs.add_(entropy[start:end, None])
            grad[start:end] = neg_probs.mul_(log_probs).mul_(grad_out[start:end, None]).to(logits.dtype)
        return grad, None


def logprobs_from_logits(
    logits: torch.Tensor, labels: torch.Tensor, chunk_size: int = DEFAULT_CHUNK_ROWS
) -> torch.Tensor:
    """Log-probability of ``labels`` under ``softmax(logits)``, computed in float32.

    Works through ``chunk_size`` token rows at a time so that float32 logits of the whole batch
    are never materialised (neither in forward nor in backward); supports autograd.

    Args:
        logits: ``[batch, seq_len, vocab]`` in any float dtype (bf16 / fp16 / fp32).
        labels: ``[batch, seq_len]`` token ids.
        chunk_size: token rows processed at once.

    Returns:
        ``[batch, seq_len]`` float32.
    """
    if logits.shape[:-1] != labels.shape:
        raise ValueError(f"logits {list(logits.shape)} and labels {list(labels.shape)} disagree on [batch, seq_len]")
    flat = _ChunkedLogProbs.apply(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1).long(), chunk_size)
    return flat.view(labels.shape)


def entropy_from_logits(logits: torch.Tensor, chunk_size: int = DEFAULT_CHUNK_ROWS) -> torch.Tensor:
    """Entropy of the categorical distribution ``softmax(logits)`` in float32 (numerically stable:
    ``logsumexp(logits) - sum(softmax(logits) * logits)``), chunked over rows; supports autograd.

    Args:
        logits: ``[..., vocab]`` (e.g. ``[batch, response_len, vocab]``).

    Returns:
        ``[...]`` float32 (e.g. ``[batch, response_len]``).
    """
    flat = _ChunkedEntropy.apply(logits.reshape(-1, logits.shape[-1]), chunk_size)
    return flat.view(logits.shape[:-1])


# ----------------------------------------------------------------------------- masks and positions
def compute_position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids for left-padded sequences: ``cumsum(mask) - 1`` clamped at 0.

    Args:
        attention_mask: ``[batch, seq_len]`` of 0/1 (0 on padding).

    Returns:
        ``[batch, seq_len]`` int64: 0 on the left padding, then 0, 1, 2, ... on the tokens.
    """
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp_min(0)


def get_response_mask(
    response_ids: torch.Tensor, eos_token_id: int | list[int], dtype: torch.dtype = torch.int64
) -> torch.Tensor:
    """Mask of the generated tokens: 1 up to and including the first EOS, 0 after it.

    Args:
        response_ids: ``[batch, response_len]``.
        eos_token_id: one EOS id or a list of them (any of them ends the response).
        dtype: dtype of the returned mask.

    Returns:
        ``[batch, response_len]``; rows without EOS are all 1.
    """
    eos_ids = torch.as_tensor(
        [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id), device=response_ids.device
    )
    is_eos = torch.isin(response_ids, eos_ids).long()
    eos_before = is_eos.cumsum(dim=-1) - is_eos
    return (eos_before == 0).to(dtype)


def pad_to_length(tensor: torch.Tensor, length: int, pad_value: float, left: bool = False) -> torch.Tensor:
    """Pad the last dimension of ``tensor`` to ``length`` with ``pad_value``.

    Args:
        tensor: ``[..., seq_len]``.
        length: target length; a tensor already this long or longer is returned unchanged.
        left: pad on the left (prompts) instead of the right (responses).

    Returns:
        ``[..., max(seq_len, length)]``.
    """
    missing = length - tensor.shape[-1]
    if missing <= 0:
        return tensor
    return torch.nn.functional.pad(tensor, (missing, 0) if left else (0, missing), value=pad_value)
