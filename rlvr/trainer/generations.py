"""Generations written out: verl's ``trainer.rollout_data_dir`` / ``trainer.validation_data_dir``
dumps and the sample table of ``trainer.log_val_generations``.

A dump is one JSONL file per step, ``<dir>/<step>.jsonl``, one line per sample (batch x n): verl's
fields ``input`` (the decoded prompt), ``output`` (the decoded response), ``gts`` (the row's
``reward_model.ground_truth``), ``score`` (the sequence score), ``step``, then every key of the reward
function's per-sample extra info (a key named like a field above replaces it, as in verl), and
``request_id`` where the batch has one. The file is written whole or not at all.

The reward function's extras travel with the batch as the non-tensor column
:data:`REWARD_EXTRA_INFO` (one dict per sample), so rows that dynamic sampling drops take theirs along.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlvr.protocol import DataProto
from rlvr.utils.files import replaced_atomically

__all__ = ["REWARD_EXTRA_INFO", "batch_texts", "pick_val_generations", "reward_extra_columns", "write_generations"]

REWARD_EXTRA_INFO = "reward_extra_info"
"""Non-tensor column of per-sample dicts: the reward function's extra info of each sample."""

VAL_GENERATIONS_SEED = 42
"""Seed of the shuffle that picks the logged validation samples (verl's)."""


def reward_extra_columns(batch: DataProto) -> dict[str, list[Any]]:
    """The per-sample extras of :data:`REWARD_EXTRA_INFO` as ``{key: [batch]}`` (None where a sample
    has no value for a key another sample has); ``{}`` for a batch that was not scored."""
    if REWARD_EXTRA_INFO not in batch.non_tensor_batch:
        return {}
    rows = list(batch.non_tensor_batch[REWARD_EXTRA_INFO])
    keys = sorted({key for row in rows for key in row})
    return {key: [row.get(key) for row in rows] for key in keys}


def batch_texts(batch: DataProto, tokenizer: Any) -> tuple[list[str], list[str], list[Any], list[float]]:
    """``(inputs, outputs, ground truths, scores)`` of a scored batch, one per row: the prompts and
    responses decoded without special tokens (padding dropped), ``reward_model.ground_truth`` (None
    without one) and ``token_level_scores.sum(-1)``."""
    inputs = tokenizer.batch_decode(batch.batch["prompts"], skip_special_tokens=True)
    outputs = tokenizer.batch_decode(batch.batch["responses"], skip_special_tokens=True)
    reward_model = batch.non_tensor_batch.get("reward_model")
    gts = [(row or {}).get("ground_truth") if isinstance(row, dict) else None
           for row in (reward_model if reward_model is not None else [None] * len(batch))]
    scores = batch.batch["token_level_scores"].sum(-1).tolist()
    return inputs, outputs, gts, scores


def _plain(value: Any) -> Any:
    """A JSON-ready value: numpy / torch scalars and arrays as Python numbers and lists."""
    if isinstance(value, (np.generic,)):
        return value.item()
    if isinstance(value, (np.ndarray, torch.Tensor)):
        return value.tolist()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def write_generations(dump_dir: str | Path, step: int, inputs: Sequence[str], outputs: Sequence[str],
                      gts: Sequence[Any], scores: Sequence[float], extras: dict[str, Sequence[Any]]) -> Path:
    """Write ``<dump_dir>/<step>.jsonl`` (one line per sample, fields as in the module docstring).

    Args:
        extras: per-sample columns added after the base fields (a column whose length is not the
            number of samples is left out, as in verl).

    Returns:
        The file written.
    """
    n = len(inputs)
    columns: dict[str, Sequence[Any]] = {"input": inputs, "output": outputs, "gts": gts, "score": scores,
                                         "step": [step] * n}
    columns.update({key: values for key, values in extras.items() if len(values) == n})
    path = Path(dump_dir) / f"{step}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with replaced_atomically(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for i in range(n):
            row = {key: _plain(values[i]) for key, values in columns.items()}
            f.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
    return path


def dump_batch(batch: DataProto, tokenizer: Any, dump_dir: str | Path, step: int,
               extra_columns: dict[str, Sequence[Any]] | None = None) -> Path:
    """:func:`write_generations` of a scored batch: its texts, the reward extras and its
    ``request_id`` column if it has one; ``extra_columns`` are added after them."""
    inputs, outputs, gts, scores = batch_texts(batch, tokenizer)
    extras = dict(extra_columns or {})
    extras.update(reward_extra_columns(batch))
    if "request_id" in batch.non_tensor_batch:
        extras.setdefault("request_id", batch.non_tensor_batch["request_id"].tolist())
    return write_generations(dump_dir, step, inputs, outputs, gts, scores, extras)


def pick_val_generations(inputs: Sequence[str], outputs: Sequence[str], scores: Sequence[float],
                         limit: int) -> list[tuple[str, str, float]]:
    """The ``limit`` validation samples to log, as verl picks them: ``(input, output, score)`` sorted
    by input, shuffled by ``RandomState(42)``, the first ``limit``; so the same prompts are shown at
    every validation."""
    if limit <= 0:
        return []
    samples = sorted(zip(inputs, outputs, scores), key=lambda sample: sample[0])
    np.random.RandomState(VAL_GENERATIONS_SEED).shuffle(samples)
    return samples[:limit]
