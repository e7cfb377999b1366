"""Builds rolled-out batches (prompts left-padded, responses right-padded + EOS) for reward tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rlvr.protocol import DataProto


def make_batch(
    tokenizer: Any,
    responses: Sequence[str],
    data_sources: Sequence[str],
    ground_truths: Sequence[Any],
    prompts: Sequence[str] | None = None,
    response_len: int | None = None,
    extra_infos: Sequence[dict] | None = None,
    **non_tensors: Sequence[Any],
) -> DataProto:
    """A DataProto with ``prompts [B,P]``, ``responses [B,R]``, ``attention_mask [B,P+R]``,
    ``response_mask [B,R]`` (response tokens + EOS) and the non-tensor reward fields."""
    prompts = list(prompts) if prompts is not None else [f"question {i}" for i in range(len(responses))]
    prompt_ids = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
    response_ids = [tokenizer.encode(r, add_special_tokens=False) + [tokenizer.eos_token_id] for r in responses]
    P = max(len(ids) for ids in prompt_ids)
    R = response_len or max(len(ids) for ids in response_ids)
    pad = tokenizer.pad_token_id
    prompt_t = torch.full((len(prompts), P), pad, dtype=torch.long)
    prompt_m = torch.zeros(len(prompts), P, dtype=torch.long)
    resp_t = torch.full((len(prompts), R), pad, dtype=torch.long)
    resp_m = torch.zeros(len(prompts), R, dtype=torch.long)
    for i, (p_ids, r_ids) in enumerate(zip(prompt_ids, response_ids)):
        r_ids = r_ids[:R]
        prompt_t[i, P - len(p_ids) :] = torch.tensor(p_ids)
        prompt_m[i, P - len(p_ids) :] = 1
        resp_t[i, : len(r_ids)] = torch.tensor(r_ids)
        resp_m[i, : len(r_ids)] = 1
    return DataProto.from_dict(
        tensors={
            "prompts": prompt_t,
            "responses": resp_t,
            "input_ids": torch.cat([prompt_t, resp_t], dim=1),
            "attention_mask": torch.cat([prompt_m, resp_m], dim=1),
            "response_mask": resp_m,
        },
        non_tensors={
            "data_source": list(data_sources),
            "reward_model": [{"ground_truth": gt} for gt in ground_truths],
            "extra_info": list(extra_infos) if extra_infos is not None else [{} for _ in responses],
            **{key: list(values) for key, values in non_tensors.items()},
        },
    )
