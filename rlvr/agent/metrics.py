"""What multi-turn rollouts report: ``agent/*`` metrics, tool use among correct answers, transcripts."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from rlvr.agent.trajectory import STOP_REASONS, TrajectoryBatch

__all__ = ["trajectory_metrics", "tool_use_metrics", "transcript", "INSERTED_OPEN", "INSERTED_CLOSE"]

INSERTED_OPEN, INSERTED_CLOSE = "[[", "]]"
"""Marks around inserted (mask 0) spans in a transcript."""


def trajectory_metrics(batch: TrajectoryBatch, counters: Sequence[str] = ()) -> dict[str, float]:
    """``agent/*`` metrics of a finished batch: model turns per sample (``agent/num_turns/mean|max|min``),
    how the trajectories ended (``agent/stop/<reason>``, fractions) and the per-sample means of the
    loop's counters (``agent/<counter>``: tool calls, tool errors, malformed calls, timeouts, truncated
    tool responses, inserted tokens, environment rewards). The names in ``counters`` are reported every
    step (0.0 when nothing was counted), so a loop's metric keys do not come and go between steps."""
    items = batch.items
    turns = np.array([t.assistant_turns for t in items], dtype=np.float64)
    metrics = {"agent/num_turns/mean": float(turns.mean()), "agent/num_turns/max": float(turns.max()),
               "agent/num_turns/min": float(turns.min())}
    for reason in STOP_REASONS:
        metrics[f"agent/stop/{reason}"] = float(np.mean([t.stop_reason == reason for t in items]))
    for name in sorted({name for t in items for name in t.counts} | set(counters)):
        metrics[f"agent/{name}"] = float(np.mean([t.counts.get(name, 0.0) for t in items]))
    return metrics


def tool_use_metrics(prefix: str, acc: Sequence[float], num_tool_calls: Sequence[int | None]) -> dict[str, float]:
    """``<prefix>/agent/tool_use_rate`` (samples with at least one tool call) and
    ``<prefix>/agent/correct_with_tool`` (the fraction of correct samples that called a tool; absent
    when none is correct). Samples without a count (single-turn rows) are left out."""
    pairs = [(float(a), int(n)) for a, n in zip(acc, num_tool_calls) if n is not None]
    if not pairs:
        return {}
    metrics = {f"{prefix}/agent/tool_use_rate": float(np.mean([n > 0 for _, n in pairs]))}
    correct = [n for a, n in pairs if a >= 1.0]
    if correct:
        metrics[f"{prefix}/agent/correct_with_tool"] = float(np.mean([n > 0 for n in correct]))
    return metrics


def transcript(tokenizer: PreTrainedTokenizerBase, responses: torch.Tensor, response_mask: torch.Tensor,
               attention_mask: torch.Tensor) -> str:
    """One response as text: sampled spans decoded without special tokens, inserted spans (tool
    results, feedback, turn separators: ``response_mask`` 0 where ``attention_mask`` is 1) decoded
    with them and marked ``[[...]]``. A single-turn response reads as its plain decoded text.

    Args:
        responses, response_mask, attention_mask: ``[R]`` rows (the attention mask's response part).
    """
    kinds = torch.where(response_mask.bool(), 1, torch.where(attention_mask.bool(), 0, -1)).tolist()
    ids = responses.tolist()
    parts, start = [], 0
    for end in range(1, len(kinds) + 1):
        if end < len(kinds) and kinds[end] == kinds[start]:
            continue
        if kinds[start] == 1:
            parts.append(tokenizer.decode(ids[start:end], skip_special_tokens=True))
        elif kinds[start] == 0:
            parts.append(INSERTED_OPEN + tokenizer.decode(ids[start:end], skip_special_tokens=False) + INSERTED_CLOSE)
        start = end
    return "".join(parts)
