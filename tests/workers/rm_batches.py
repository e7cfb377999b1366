"""A rollout batch of chat prompts and responses for the reward-model and teacher tests, and the
reward model's expected input text, written out by hand (not with rlvr's builder)."""

from __future__ import annotations

import numpy as np
import torch

from rlvr.protocol import DataProto
from rlvr.utils.testing import tiny_tokenizer
from rlvr.utils.torch_functional import compute_position_ids

QUESTIONS = ["1+1=", "say hi", "abc?", "count to 3"]
RESPONSES = ["2<|im_end|>", "hi there<|im_end|>", "a b", "1 2 3<|im_end|>"]
"""Response texts as sampled: three end with the EOS token, one was cut at the length limit."""


def rm_expected_text(row: int) -> str:
    """The reward model's input of ``row`` under :data:`~rlvr.utils.testing.RM_CHAT_TEMPLATE`: the
    template's BOS removed, the policy's EOS text removed from the response."""
    response = RESPONSES[row].replace("<|im_end|>", "")
    return f"### user: {QUESTIONS[row]}\n### assistant: {response}\n### end"


def chat_rollout_batch(response_len: int = 24) -> DataProto:
    """``prompts`` (the tiny tokenizer's chat template, left-padded), ``responses`` (right-padded),
    ``input_ids``/``attention_mask``/``position_ids [B, P+R]``, ``response_mask`` and ``raw_prompt``."""
    tokenizer = tiny_tokenizer()
    chats = [[{"role": "user", "content": q}] for q in QUESTIONS]
    prompts = [tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True) for chat in chats]
    prompts = [list(p["input_ids"]) if not isinstance(p, list) else p for p in prompts]
    responses = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in RESPONSES]
    prompt_len = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id
    prompt_ids = torch.tensor([[pad] * (prompt_len - len(p)) + p for p in prompts])
    prompt_mask = torch.tensor([[0] * (prompt_len - len(p)) + [1] * len(p) for p in prompts])
    response_ids = torch.tensor([r + [pad] * (response_len - len(r)) for r in responses])
    response_mask = torch.tensor([[1] * len(r) + [0] * (response_len - len(r)) for r in responses])
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    return DataProto.from_dict(
        tensors={"prompts": prompt_ids, "responses": response_ids, "input_ids": torch.cat([prompt_ids, response_ids], 1),
                 "attention_mask": attention_mask, "position_ids": compute_position_ids(attention_mask),
                 "response_mask": response_mask},
        non_tensors={"raw_prompt": np.array(chats + [None], dtype=object)[:-1], "data_source": ["toy"] * len(chats),
                     "uid": [str(i) for i in range(len(chats))]},
        meta_info={"temperature": 1.0},
    )
