"""Sampling settings and next-token sampling with exact log-probs.

Nucleus (top-p) sampling: Holtzman et al. 2020, "The Curious Case of Neural Text Degeneration"
(arXiv:1904.09751). The log-prob returned for a sampled token is ``log_softmax(logits /
temperature)`` in float32, *before* top-k/top-p filtering: the distribution the actor scores
(``compute_log_prob`` divides its logits by the same temperature), so the two agree exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["SamplingParams", "resolve_sampling", "sample_tokens"]


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
    scaled = logits.float() / params.log_prob_temperature
    log_probs = torch.log_softmax(scaled, dim=-1)
    if params.greedy:
        tokens = scaled.argmax(dim=-1)
    else:
        probs = _filter_top_k_top_p(scaled, params.top_k, params.top_p).softmax(dim=-1)
        tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return tokens, log_probs.gather(-1, tokens[:, None]).squeeze(-1)
