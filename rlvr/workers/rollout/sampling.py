"""Sampling settings and next-token sampling with exact log-probs.

Nucleus (top-p) sampling: Holtzman et al. 2020, "The Curious Case of Neural Text Degeneration"
(arXiv:1904.09751). The log-prob returned for a sampled token is ``log_softmax(logits /
temperature)`` in float32, *before* top-k/top-p filtering: the distribution the actor scores
(``compute_log_prob`` divides its logits by the same temperature), so the two agree exactly.

Tokens are drawn by inverting the cumulative distribution: one uniform number per row, located
in the row's running sum of probabilities, first among blocks of the vocabulary, then inside one
block. This is an exact draw from the categorical distribution, many times faster than
``torch.multinomial`` on CPU for a 49K vocabulary (one random number per row instead of one per
vocabulary entry), and free of host synchronisation on GPU.

The random draw and the arithmetic are split: :func:`draw_uniform` takes the one ``[rows, 1]``
float64 uniform draw per step from the engine's ``torch.Generator``, and :func:`sample_with_uniform`
is a pure function of the logits and those numbers, which the compiled decode step fuses with the
model's forward (:mod:`~rlvr.workers.rollout.static_decode`). :func:`sample_tokens` chains the two.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["SamplingParams", "draw_uniform", "resolve_sampling", "sample_tokens", "sample_with_uniform"]


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is picked.

    Attributes:
        do_sample: sample; False picks the argmax (greedy).
        temperature: logits are divided by it; ``<= 0`` means greedy.
        top_p: keep the smallest set of tokens whose probability reaches ``top_p`` (1.0 = off).
        top_k: keep the ``top_k`` most likely tokens (``<= 0`` = off).
    """

    do_sample: bool = True
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1

    @property
    def greedy(self) -> bool:
        return not self.do_sample or self.temperature <= 0

    @property
    def log_prob_temperature(self) -> float:
        """Temperature of the reported log-probs (1.0 for greedy decoding)."""
        return 1.0 if self.greedy else float(self.temperature)


def resolve_sampling(rollout_config, meta_info: dict[str, Any]) -> SamplingParams:
    """Sampling settings of one ``generate_sequences`` call.

    ``meta_info["validate"]`` selects ``rollout.val_kwargs`` instead of the training settings;
    ``do_sample``, ``temperature``, ``top_p``, ``top_k`` in ``meta_info`` override either.
    """
    source = rollout_config.val_kwargs if meta_info.get("validate", False) else rollout_config
    values = {
        "do_sample": bool(source.do_sample),
        "temperature": float(source.temperature),
        "top_p": float(source.top_p),
        "top_k": int(source.top_k),
    }
    for key, cast in (("do_sample", bool), ("temperature", float), ("top_p", float), ("top_k", int)):
        if key in meta_info:
            values[key] = cast(meta_info[key])
    params = SamplingParams(**values)
    if not 0.0 < params.top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {params.top_p}")
    return params


def _filter_top_k_top_p(scaled: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set the logits outside the top-k / nucleus to ``-inf``; ``scaled`` is ``[batch, vocab]``."""
    if 0 < top_k < scaled.shape[-1]:
        kth = scaled.topk(top_k, dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = scaled.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        drop_sorted = mass_before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scaled = scaled.masked_fill(drop, float("-inf"))
    return scaled


BLOCK = 256  # vocabulary entries per block of the two-level draw (about the square root of a 49K-152K vocabulary)


def _block_sums(weights: torch.Tensor) -> torch.Tensor:
    """``[batch, ceil(vocab / BLOCK)]`` float64 sums of consecutive ``BLOCK``-entry slices of
    ``weights`` ``[batch, vocab]`` (the last block may be shorter)."""
    rows, vocab = weights.shape
    whole = vocab // BLOCK * BLOCK
    sums = weights[:, :whole].reshape(rows, -1, BLOCK).sum(dim=-1, dtype=torch.float64)
    if whole < vocab:
        sums = torch.cat([sums, weights[:, whole:].sum(dim=-1, keepdim=True, dtype=torch.float64)], dim=1)
    return sums


def draw_uniform(rows: int, params: SamplingParams, generator: torch.Generator | None,
                 device: torch.device | str) -> torch.Tensor | None:
    """The random numbers of one sampling step: ``[rows, 1]`` float64 ``U[0, 1)`` from ``generator``,
    or None for greedy decoding (which draws nothing, so the generator does not advance)."""
    if params.greedy:
        return None
    return torch.rand(rows, 1, generator=generator, device=device, dtype=torch.float64)


def _inverse_cdf_pick(weights: torch.Tensor, uniform: torch.Tensor,
                      block_sums: torch.Tensor | None = None) -> torch.Tensor:
    """One token per row of ``weights`` ``[batch, vocab]`` (non-negative, not necessarily normalised)
    for the uniform numbers ``uniform`` ``[batch, 1]`` float64 in ``[0, 1)``.

    Token ``i`` is chosen when ``u * total`` falls in ``[cdf[i-1], cdf[i])`` for ``u ~ U[0, 1)``;
    tokens of weight 0 cover an empty interval and are never chosen. The draw takes two levels: the
    running sum of the ``BLOCK``-entry block sums (``block_sums``, from :func:`_block_sums` when not
    given) finds the block, then the running sum inside that one block finds the token. That is the
    same draw as one running sum over the whole vocabulary (one uniform number per row, the same
    intervals), but it makes one pass over the vocabulary instead of a sequential float64 scan of it,
    which was three quarters of the sampling time on CPU. Sums are taken in float64: in float32 the
    rounding of a 49K-entry sum would move the tail tokens' interval boundaries by more than their
    probabilities.
    """
    vocab = weights.shape[1]
    if block_sums is None:
        block_sums = _block_sums(weights)
    block_cdf = block_sums.cumsum(dim=-1)
    total = block_cdf[:, -1:]
    target = uniform * total
    # keep u * total strictly below total after rounding, so the last positive token is the largest pick
    target = torch.minimum(target, torch.nextafter(total, torch.zeros_like(total)))
    block = torch.searchsorted(block_cdf, target, right=True).clamp_(max=block_cdf.shape[1] - 1)
    inside = target - (block_cdf.gather(1, block) - block_sums.gather(1, block))  # [rows, 1]
    columns = (block * BLOCK + torch.arange(BLOCK, device=weights.device)).clamp_(max=vocab - 1)  # [rows, BLOCK]
    past_vocab = columns != block * BLOCK + torch.arange(BLOCK, device=weights.device)
    block_weights = weights.gather(1, columns).double().masked_fill(past_vocab, 0.0)  # (no boolean indexing: compilable)
    cdf = block_weights.cumsum(dim=-1)
    pick = torch.searchsorted(cdf, inside, right=True)
    # rounding can leave `inside` at or past the block's own running total: take its last positive token
    last_positive = (BLOCK - 1 - (block_weights > 0).flip(-1).int().argmax(dim=-1, keepdim=True))
    pick = torch.minimum(pick, last_positive)
    return columns.gather(1, pick).squeeze(-1)


def sample_tokens(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick the next token of each row.

    Args:
        logits: ``[batch, vocab]`` next-token logits (any float dtype; computed in float32).
        params: the sampling settings.
        generator: the random stream for sampling (on the logits' device).

    Returns:
        ``(tokens [batch] int64, log_probs [batch] float32)`` with ``log_probs`` under
        ``softmax(logits / params.log_prob_temperature)``.
    """
    return sample_with_uniform(logits, params, draw_uniform(logits.shape[0], params, generator, logits.device))


def sample_with_uniform(logits: torch.Tensor, params: SamplingParams, uniform: torch.Tensor | None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`sample_tokens` for the random numbers ``uniform`` ``[batch, 1]`` of
    :func:`draw_uniform` (None when greedy): a pure function of its inputs, with no generator, so
    ``torch.compile`` can put it in the decode step's CUDA graph (it cannot take a custom
    ``torch.Generator``). ``sample_tokens(logits, params, g)`` equals
    ``sample_with_uniform(logits, params, draw_uniform(batch, params, g, device))`` bit for bit.
    """
    scaled = logits.float()
    if params.log_prob_temperature != 1.0:
        scaled = scaled / params.log_prob_temperature
    peak = scaled.amax(dim=-1, keepdim=True)
    weights = torch.sub(scaled, peak).exp_()  # unnormalised probabilities, one pass over the vocabulary
    block_sums = _block_sums(weights)  # float64; their total is the normaliser as well
    log_norm = peak.squeeze(-1) + block_sums.sum(dim=-1).log().float()
    if params.greedy:
        tokens = scaled.argmax(dim=-1)
    else:
        if uniform is None:
            raise ValueError("sampling (do_sample with temperature > 0) needs the uniform numbers of draw_uniform")
        if 0 < params.top_k < scaled.shape[-1] or params.top_p < 1.0:
            tokens = _inverse_cdf_pick(_filter_top_k_top_p(scaled, params.top_k, params.top_p).softmax(dim=-1), uniform)
        else:
            tokens = _inverse_cdf_pick(weights, uniform, block_sums)
    return tokens, scaled.gather(-1, tokens[:, None]).squeeze(-1) - log_norm
