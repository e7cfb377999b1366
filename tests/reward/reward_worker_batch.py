"""Batch builder of the reward-worker tests (module name unique across tests/ for pytest's prepend import)."""

from __future__ import annotations

import numpy as np
import torch

from rlvr.protocol import DataProto
from rlvr.utils.testing import tiny_tokenizer


def build_batch(responses: list[str], truths: list, prompts: list[str] | None = None, gt_key: str = "reward_model",
                extra_info: list[dict] | None = None, pad_extra: int = 3) -> DataProto:
    """A rolled-out batch: left-padded ``prompts [B, P]``, right-padded ``responses [B, R]`` (with
    ``pad_extra`` pad columns and EOS), masks, and the ground truths under ``gt_key``."""
    tok = tiny_tokenizer()
    prompts = prompts or [f"question {i}" for i in range(len(responses))]
    p_ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    r_ids = [tok(r, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for r in responses]
    P, R = max(map(len, p_ids)), max(map(len, r_ids)) + pad_extra
    pad = tok.pad_token_id
    prompt_t = torch.tensor([[pad] * (P - len(x)) + x for x in p_ids])
    resp_t = torch.tensor([x + [pad] * (R - len(x)) for x in r_ids])
    prompt_mask = torch.tensor([[0] * (P - len(x)) + [1] * len(x) for x in p_ids])
    resp_mask = torch.tensor([[1] * len(x) + [0] * (R - len(x)) for x in r_ids])
    truth_field = [{"ground_truth": t} for t in truths] if gt_key == "reward_model" else list(truths)
    non_tensors = {gt_key: np.array(truth_field + [None], dtype=object)[:-1]}
    if extra_info is not None:
        non_tensors["extra_info"] = np.array(extra_info + [None], dtype=object)[:-1]
    return DataProto.from_dict(
        tensors={
            "prompts": prompt_t, "responses": resp_t, "input_ids": torch.cat([prompt_t, resp_t], dim=1),
            "attention_mask": torch.cat([prompt_mask, resp_mask], dim=1), "response_mask": resp_mask,
        },
        non_tensors=non_tensors,
        meta_info={"validate": False},
    )


def last_token_index(data: DataProto) -> torch.Tensor:
    """``[batch]`` index of the EOS token (the last valid response token) of every row."""
    return data.batch["response_mask"].sum(dim=-1) - 1
