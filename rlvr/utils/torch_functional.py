"""Tensor helpers shared by the algorithms and the workers: masked statistics, log-probs and
entropy from logits (chunked, float32), masks, padding and position ids.

All functions are pure torch and work on any device. Names and signatures follow verl's
``verl.utils.torch_functional`` where verl has the same function.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlvr.utils.errors import ArgumentAssertionError

__all__ = [
    "masked_sum",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "clip_by_value",
    "gather_from_labels",
    "logprobs_from_logits",
    "entropy_from_logits",
    "entropy_from_logits_with_chunking",
    "calculate_sum_pi_squared_from_logits",
    "expand_as_nested",
    "compute_position_ids",
    "left_pad",
    "get_response_mask",
    "pad_sequence_to_length",
    "pad_2d_list_to_length",
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


def clip_by_value(x: torch.Tensor, tensor_min: torch.Tensor | float, tensor_max: torch.Tensor | float) -> torch.Tensor:
    """``x`` clipped elementwise to ``[tensor_min, tensor_max]``, whose bounds may be tensors
    broadcastable to ``x`` (``torch.clamp`` with tensor bounds)."""
    return torch.clamp(x, min=tensor_min, max=tensor_max)


# ----------------------------------------------------------------------------- log-probs and entropy
def gather_from_labels(data: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    """``data[..., label]`` per position: ``[..., vocab]`` and ``[...]`` ids -> ``[...]``."""
    return torch.gather(data, -1, label.unsqueeze(-1)).squeeze(-1)

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


def entropy_from_logits_with_chunking(logits: torch.Tensor, chunk_size: int = 2048) -> torch.Tensor:
    """verl's name for :func:`entropy_from_logits` with an explicit chunk of rows (``[rows, vocab]``
    -> ``[rows]``); rlvr's entropy is always computed ``chunk_size`` rows at a time."""
    return entropy_from_logits(logits, chunk_size)


def calculate_sum_pi_squared_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """``sum_v softmax(logits)_v^2`` per position, ``[..., vocab] -> [...]``, computed stably as
    ``exp(logsumexp(2 z) - 2 logsumexp(z))`` (the ``||pi||^2`` term of the optimal token baseline's
    per-token variance proxy, verl's ``optimal_token_baseline`` estimator)."""
    return torch.exp(torch.logsumexp(2.0 * logits, dim=-1) - 2.0 * torch.logsumexp(logits, dim=-1))


def expand_as_nested(tensor: torch.Tensor, nested_tensor: torch.Tensor) -> torch.Tensor:
    """Broadcast one value per row over a jagged nested tensor.

    Args:
        tensor: ``[batch]``.
        nested_tensor: a jagged nested tensor ``[batch, j]`` (``torch.nested``, ``layout=torch.jagged``).

    Returns:
        a jagged nested tensor with ``nested_tensor``'s row lengths whose row ``i`` is ``tensor[i]``
        repeated.

    Raises:
        ArgumentAssertionError: ``nested_tensor`` is not nested or not 2-D, ``tensor`` is not 1-D,
            or their batch sizes differ (an ``AssertionError`` as in verl, and a ``ValueError``).
    """
    if not nested_tensor.is_nested:
        raise ArgumentAssertionError("expand_as_nested: nested_tensor must be a nested (jagged) tensor")
    if tensor.dim() != 1 or nested_tensor.dim() != 2:
        raise ArgumentAssertionError(f"expand_as_nested: need tensor [batch] and nested_tensor [batch, j], got "
                                     f"{tensor.dim()}-D and {nested_tensor.dim()}-D")
    if tensor.shape[0] != nested_tensor.size(0):
        raise ArgumentAssertionError(f"expand_as_nested: the batch sizes differ: {tensor.shape[0]} vs "
                                     f"{nested_tensor.size(0)}")
    offsets = nested_tensor.offsets()
    values = torch.repeat_interleave(tensor, offsets.diff(), dim=0)
    return torch.nested.nested_tensor_from_jagged(values=values, offsets=offsets)


# ----------------------------------------------------------------------------- masks and positions
def compute_position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids for left-padded sequences: ``cumsum(mask) - 1`` clamped at 0.

    Args:
        attention_mask: ``[batch, seq_len]`` of 0/1 (0 on padding).

    Returns:
        ``[batch, seq_len]`` int64: 0 on the left padding, then 0, 1, 2, ... on the tokens.
    """
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp_min(0)


def left_pad(rows: Sequence[Sequence[int]], width: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, attention_mask)`` ``[len(rows), width]`` int64: each row of ids right-aligned after
    ``pad_id`` padding (mask 0 on the padding)."""
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        if len(row):
            ids[i, width - len(row):] = torch.tensor(list(row), dtype=torch.long)
            mask[i, width - len(row):] = 1
    return ids, mask


def get_response_mask(response_id: torch.Tensor, eos_token: int | Sequence[int] = 2,
                      dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """Mask of the generated tokens: 1 up to and including the first EOS, 0 after it.

    Args:
        response_id: ``[batch, response_len]``.
        eos_token: one EOS id or a list of them (any of them ends the response).
        dtype: dtype of the returned mask.

    Returns:
        ``[batch, response_len]``; rows without EOS are all 1.
    """
    eos_ids = torch.as_tensor([eos_token] if isinstance(eos_token, int) else list(eos_token),
                             device=response_id.device)
    is_eos = torch.isin(response_id, eos_ids).long()
    eos_before = is_eos.cumsum(dim=-1) - is_eos
    return (eos_before == 0).to(dtype)


def pad_sequence_to_length(tensors: torch.Tensor, max_seq_len: int, pad_token_id: float,
                           left_pad: bool = False) -> torch.Tensor:
    """Pad the last dimension of ``tensors`` to ``max_seq_len`` with ``pad_token_id``.

    Args:
        tensors: ``[..., seq_len]``.
        max_seq_len: target length; a tensor already this long or longer is returned unchanged.
        left_pad: pad on the left (prompts) instead of the right (responses).

    Returns:
        ``[..., max(seq_len, max_seq_len)]``.
    """
    missing = max_seq_len - tensors.shape[-1]
    if missing <= 0:
        return tensors
    return torch.nn.functional.pad(tensors, (missing, 0) if left_pad else (0, missing), value=pad_token_id)


def pad_2d_list_to_length(response: Sequence[Sequence[int]], pad_token_id: int,
                          max_length: int | None = None) -> torch.Tensor:
    """Right-pad lists of ids into a ``[len(response), L]`` tensor, ``L`` = the longest list, or
    ``max_length`` when that is longer."""
    length = max([len(row) for row in response] + [max_length or 0])
    return torch.tensor([list(row) + [pad_token_id] * (length - len(row)) for row in response])
