"""A discriminative reward model's input and its scores as a reward function.

The input of a sample is built as verl 0.9's reward loop builds it, so that a reward model trained
or served for verl scores the same text:

1. the response's valid ids (the first ``attention_mask[-R:].sum()`` ids of ``responses``) decoded
   with the policy's tokenizer, special tokens kept, then every occurrence of its EOS token text
   removed;
2. the chat ``raw_prompt + [{"role": "assistant", "content": <that text>}]`` rendered with the
   *reward model's* chat template (``add_generation_prompt=False``), so a reward model whose
   template differs from the policy's sees its own format;
3. a leading BOS text removed, then tokenized with the reward model's tokenizer adding its special
   tokens (as the inference server verl sends the text to does): exactly one BOS for a model that
   has one.

The score is the classifier's output at the last token of that input (a ``num_labels=1`` head);
``rm_scores [B, R]`` holds it at the last valid response position (verl's layout).
:class:`RewardModelScores` turns ``rm_scores`` into a reward function for the reward routing.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

from rlvr.protocol import DataProto
from rlvr.utils.errors import RewardError

__all__ = ["RM_SCORES", "response_text", "rm_chat", "rm_chat_text", "rm_tokenize", "rm_input_ids", "place_rm_scores",
           "RewardModelScores"]

RM_SCORES = "rm_scores"
"""Batch key of the reward model's scores ``[B, R]`` (verl's)."""


def _valid_response_ids(data: DataProto, row: int) -> torch.Tensor:
    responses = data.batch["responses"][row]
    valid = int(data.batch["attention_mask"][row, -responses.shape[0]:].sum())
    return responses[:valid]


def response_text(data: DataProto, row: int, input_tokenizer: Any) -> str:
    """Sample ``row``'s response as the reward model reads it (step 1): its valid ids decoded with
    special tokens, the EOS token's text removed."""
    response = input_tokenizer.decode(_valid_response_ids(data, row).tolist())
    return response.replace(input_tokenizer.eos_token, "") if input_tokenizer.eos_token else response


def rm_chat(messages: Any, response: str, rm_tokenizer: Any) -> str:
    """The reward model's input text of a conversation and its response (step 2 and the BOS strip
    of step 3); the RM trainer builds its pairs with it too, so training and scoring read the same text.

    Raises:
        RewardError: the reward model's tokenizer has no chat template.
    """
    if not rm_tokenizer.chat_template:
        raise RewardError("the reward model's tokenizer has no chat template, and its input is the conversation "
                          "rendered with it (as verl builds it); give the reward model a tokenizer with a chat template")
    chat = [dict(message) for message in messages]
    chat.append({"role": "assistant", "content": response})
    text = rm_tokenizer.apply_chat_template(chat, add_generation_prompt=False, tokenize=False)
    bos = rm_tokenizer.bos_token
    return text[len(bos):] if bos and text.startswith(bos) else text


def rm_chat_text(data: DataProto, row: int, input_tokenizer: Any, rm_tokenizer: Any) -> str:
    """The reward model's input text of sample ``row`` (steps 1-2 and the BOS strip of step 3).

    Raises:
        RewardError: the batch has no ``raw_prompt`` or the reward model's tokenizer no chat template.
    """
    if "raw_prompt" not in data.non_tensor_batch:
        raise RewardError("the reward model needs each sample's chat messages (non-tensor 'raw_prompt', kept by "
                          "rlvr's datasets); the batch has only "
                          f"{sorted(data.non_tensor_batch)}")
    return rm_chat(data.non_tensor_batch["raw_prompt"][row], response_text(data, row, input_tokenizer), rm_tokenizer)


def rm_tokenize(text: str, rm_tokenizer: Any) -> list[int]:
    """Step 3's ids: the text tokenized with the reward model's special tokens added."""
    return list(rm_tokenizer(text, add_special_tokens=True)["input_ids"])


def rm_input_ids(data: DataProto, input_tokenizer: Any, rm_tokenizer: Any, max_length: int) -> list[list[int]]:
    """Token ids of every sample's reward-model input (the module docstring's steps 1-3).

    Raises:
        RewardError: an input longer than ``max_length`` (refused: the score is read at the last
            token, and cutting either end would score another text), naming the sample and the keys.
    """
    inputs = []
    for row in range(len(data)):
        ids = rm_tokenize(rm_chat_text(data, row, input_tokenizer, rm_tokenizer), rm_tokenizer)
        if len(ids) > max_length:
            uid = data.non_tensor_batch["uid"][row] if "uid" in data.non_tensor_batch else None
            which = f"sample {row}" + (f" (uid {uid!r})" if uid is not None else "")
            raise RewardError(
                f"{which}: its reward-model input has {len(ids)} tokens, more than the limit {max_length} "
                "(reward.reward_model.rollout.max_model_len, legacy reward_model.max_length; default "
                "prompt_length + response_length of reward.reward_model.rollout); raise it or lower "
                "data.max_response_length. rlvr refuses rather than truncates: the score is read at the last token")
        inputs.append(ids)
    return inputs


def place_rm_scores(data: DataProto, scores: torch.Tensor) -> torch.Tensor:
    """``rm_scores [B, R]``: each sample's score at its last valid response position (verl's
    layout; the position is counted by ``attention_mask`` over the response columns)."""
    responses = data.batch["responses"]
    valid = data.batch["attention_mask"][:, -responses.shape[1]:].sum(-1)
    out = torch.zeros(responses.shape, dtype=torch.float32)
    out[torch.arange(len(scores)), valid - 1] = scores.float()
    return out


class RewardModelScores:
    """The reward model as a reward function: ``token_level_scores`` are the ``rm_scores`` that
    the trainer put in the batch (reward-model worker group, before the reward stage). A reward
    manager (``__call__(data, return_dict)``), so it routes and combines like one.

    Extra info per sample: ``rm_score``. Metrics: ``reward_model/<data_source>/mean_score``.
    """

    def __call__(self, data: DataProto, return_dict: bool = False) -> torch.Tensor | dict[str, Any]:
        if RM_SCORES not in data.batch.keys():
            raise RewardError(f"the batch has no {RM_SCORES!r}: the trainer computes them with the reward-model "
                              "worker group before scoring (is reward.reward_model.enable set on the trainer's config?)")
        tensor = data.batch[RM_SCORES].float()
        if not return_dict:
            return tensor
        sums = tensor.sum(-1).tolist()
        by_source: dict[str, list[float]] = defaultdict(list)
        for source, score in zip(data.non_tensor_batch.get("data_source", ["unknown"] * len(data)), sums):
            by_source[str(source)].append(score)
        metrics = {f"reward_model/{source}/mean_score": sum(v) / len(v) for source, v in by_source.items()}
        return {"reward_tensor": tensor, "reward_extra_info": {"rm_score": sums}, "reward_metrics": metrics}
