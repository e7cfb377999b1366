"""Reading a rolled-out batch for scoring: the one place responses and prompts are decoded.

A batch holds ``prompts [batch, P]`` (left-padded), ``responses [batch, R]`` (right-padded),
``attention_mask [batch, P + R]`` and ``response_mask [batch, R]`` (derived from the response part of
``attention_mask`` when absent); the non-tensor fields ``reward_model`` (dicts with
``ground_truth``; or a plain ``ground_truth`` column, as ``examples/custom_reward_worker.py`` reads
it), ``extra_info`` (optional) and the data source. A response is its tokens up to and including
the last valid one (so tokens a multi-turn loop inserted between generated ones stay in the text), a
prompt its non-padding tokens. Both are decoded with the tokenizer's ``batch_decode(...,
skip_special_tokens=True)``, one call per batch (``decode`` row by row for a tokenizer without
``batch_decode``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rlvr.protocol import DataProto
from rlvr.utils.errors import RewardError

__all__ = [
    "DecodedBatch",
    "decode_batch",
    "decode_prompts",
    "decode_responses",
    "extra_infos",
    "ground_truths",
    "last_valid_index",
    "response_mask_of",
]


def response_mask_of(data: DataProto) -> torch.Tensor:
    """``response_mask [batch, response_len]`` (derived from ``attention_mask`` when absent)."""
    response_len = data.batch["responses"].shape[-1]
    if "response_mask" in data.batch.keys():
        return data.batch["response_mask"]
    return data.batch["attention_mask"][:, -response_len:]


def last_valid_index(mask: torch.Tensor) -> torch.Tensor:
    """``[batch]`` index of the last 1 in each row of ``mask [batch, len]`` (0 for an all-zero row)."""
    positions = torch.arange(mask.shape[-1], device=mask.device).expand_as(mask)
    return torch.where(mask.bool(), positions, torch.zeros_like(positions)).max(dim=-1).values


def decode_responses(data: DataProto, tokenizer: Any) -> list[str]:
    """Text of every response: its tokens up to and including the last valid one."""
    mask = response_mask_of(data)
    ends = torch.where(mask.bool().any(dim=-1), last_valid_index(mask) + 1, torch.zeros(len(mask), dtype=torch.long))
    # numpy rows: transformers' batch_decode converts them in one call each (python lists of ints
    # are type-checked element by element, several times slower for long responses)
    rows = [row[:end] for row, end in zip(data.batch["responses"].cpu().numpy(), ends.tolist())]
    return _decode_rows(tokenizer, rows)


def decode_prompts(data: DataProto, tokenizer: Any) -> list[str]:
    """Text of every prompt: its non-padding tokens."""
    prompts = data.batch["prompts"]
    keep = data.batch["attention_mask"][:, : prompts.shape[-1]].bool().cpu().numpy()
    rows = [row[k] for row, k in zip(prompts.cpu().numpy(), keep)]
    return _decode_rows(tokenizer, rows)


def _decode_rows(tokenizer: Any, rows: list) -> list[str]:
    """The text of each row of token ids: one ``batch_decode`` call, or ``decode`` row by row for
    a tokenizer that has only ``decode`` (verl's reward managers decode row by row, and stub
    tokenizers written for them define only that)."""
    batch_decode = getattr(tokenizer, "batch_decode", None)
    if batch_decode is not None:
        return batch_decode(rows, skip_special_tokens=True)
    return [tokenizer.decode(row, skip_special_tokens=True) for row in rows]


def ground_truths(data: DataProto) -> list[Any]:
    """Per-sample ground truth: ``reward_model[i]["ground_truth"]`` (None when a dict has none), or
    a plain ``ground_truth`` column."""
    columns = data.non_tensor_batch
    if "reward_model" in columns:
        if not all(isinstance(rm, dict) for rm in columns["reward_model"]):
            raise RewardError("non_tensor_batch['reward_model'] entries must be dicts, e.g. {'ground_truth': '72'}")
        return [rm.get("ground_truth") for rm in columns["reward_model"]]
    if "ground_truth" in columns:
        return list(columns["ground_truth"])
    raise RewardError(
        f"the batch has no ground truth: expected the non-tensor field 'reward_model' (dicts with 'ground_truth') "
        f"or 'ground_truth'; it has {sorted(columns)}"
    )


def extra_infos(data: DataProto) -> list[dict]:
    """Per-sample ``extra_info`` dicts (empty dicts when the batch has none)."""
    if "extra_info" not in data.non_tensor_batch:
        return [{} for _ in range(len(data))]
    return [dict(e) if e is not None else {} for e in data.non_tensor_batch["extra_info"]]


@dataclass
class DecodedBatch:
    """What a reward manager scores, one entry per sample.

    Attributes:
        prompts / responses: decoded text (see the module docstring).
        last_index: ``[batch]`` position of the last valid response token (0 for an empty response).
        response_length: ``[batch]`` number of valid response tokens.
        response_len: ``R``, the padded response width.
    """

    prompts: list[str]
    responses: list[str]
    data_sources: list[str]
    ground_truths: list[Any]
    extra_infos: list[dict]
    last_index: torch.Tensor
    response_length: torch.Tensor
    response_len: int


def decode_batch(data: DataProto, tokenizer: Any, reward_fn_key: str = "data_source") -> DecodedBatch:
    """Decode prompts and responses and collect the data source (``reward_fn_key``), ground truth
    and ``extra_info`` of every sample."""
    if reward_fn_key not in data.non_tensor_batch:
        raise RewardError(
            f"the batch has no non-tensor field {reward_fn_key!r} (has: {sorted(data.non_tensor_batch)}); reward "
            f"managers read each sample's data source from reward_fn_key={reward_fn_key!r}"
        )
    mask = response_mask_of(data)
    return DecodedBatch(
        prompts=decode_prompts(data, tokenizer),
        responses=decode_responses(data, tokenizer),
        data_sources=[str(s) for s in data.non_tensor_batch[reward_fn_key]],
        ground_truths=ground_truths(data),
        extra_infos=extra_infos(data),
        last_index=last_valid_index(mask),
        response_length=mask.sum(dim=-1).long(),
        response_len=data.batch["responses"].shape[-1],
    )
