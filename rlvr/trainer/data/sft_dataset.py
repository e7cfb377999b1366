"""Multi-turn SFT data: conversations rendered with the chat template, the loss on the assistant's tokens.

A row (parquet or JSONL) holds the conversation under ``data.messages_key``, optionally its tools
(``data.tools_key``, passed to the chat template) and an ``enable_thinking`` flag::

    {"messages": [{"role": "system", "content": "..."},
                  {"role": "user", "content": "..."},
                  {"role": "assistant", "content": "...", "tool_calls": [...]},
                  {"role": "tool", "content": "..."},
                  {"role": "assistant", "content": "..."}]}

Each turn's tokens are what the chat template adds for it: the ids of the conversation up to turn
``i`` rendered whole extend the ids up to turn ``i - 1``. An assistant turn is trained on all of its
tokens except its header (the template's generation prompt, ``<|im_start|>assistant\\n``), so its
end-of-turn token is learnt; system, user and tool turns are context only. The ids are therefore
those of the whole conversation rendered at once, and the prompt of every assistant turn is what
generation would be given. A template that renders earlier turns differently once later ones
follow (some strip earlier reasoning) breaks that: such a row is an error naming it, or with
``data.ignore_input_ids_mismatch`` its turns are rendered one by one and concatenated (verl's
behaviour for every row; for a row without the mismatch both give the same ids).

A missing or malformed messages field is a :class:`~rlvr.utils.errors.DataError` naming the file,
the row and the field.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch.utils.data import Dataset

from rlvr.trainer.data.rl_dataset import read_located_rows
from rlvr.utils.errors import DataError
from rlvr.utils.torch_functional import compute_position_ids
from rlvr.utils.user_code import UserCodeError, load_object

__all__ = ["MultiTurnSFTDataset", "conversation_problem", "collate_sft_batch", "create_sft_dataset", "ROLES"]

logger = logging.getLogger(__name__)

ROLES = ("system", "user", "assistant", "tool")


def _message_problem(message: Any, field: str) -> str | None:
    if not isinstance(message, dict):
        return f"field {field} is not a message object but {type(message).__name__}"
    role = message.get("role")
    if role not in ROLES:
        return f"field {field}.role is {role!r}; a message's role is one of {', '.join(ROLES)}"
    content = message.get("content")
    if not isinstance(content, str) and not (role == "assistant" and content is None and message.get("tool_calls")):
        return (f"field {field}.content must be a string (an assistant turn with tool_calls may have null content), "
                f"got {type(content).__name__}")
    return None


def conversation_problem(row: Any, key: str) -> str | None:
    """What makes ``row`` unusable for SFT, naming the field, or None."""
    if not isinstance(row, dict):
        return f"is not an object with fields but a {type(row).__name__}"
    if row.get(key) is None:  # a parquet file holds a row without the field as null
        return f"has no {key!r} field (the conversation; data.messages_key names the field to read)"
    messages = row[key]
    if not isinstance(messages, list) or not messages:
        return f"field {key!r} must be a non-empty list of messages [{{'role': ..., 'content': ...}}], got {messages!r:.80}"
    for i, message in enumerate(messages):
        problem = _message_problem(message, f"{key}[{i}]")
        if problem is not None:
            return problem
    if not any(m["role"] == "assistant" for m in messages):
        return f"field {key!r} has no assistant message: nothing to train on"
    return None


def _clean(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages without null fields (a parquet file gives every message every struct field)."""
    return [{k: v for k, v in message.items() if v is not None} for message in messages]


class _Mismatch(NamedTuple):
    """Turn ``turn`` changed the ids before it from token ``changed`` of ``total`` on."""

    turn: int
    changed: int
    total: int


def _common_prefix(one: list[int], two: list[int]) -> int:
    n = 0
    for a, b in zip(one, two):
        if a != b:
            break
        n += 1
    return n


class MultiTurnSFTDataset(Dataset):
    """Conversations for SFT, tokenised once at construction (verl's class name and arguments).

    Args:
        parquet_files: one ``.parquet`` / ``.jsonl`` path or a list of them.
        tokenizer: a Hugging Face tokenizer with a chat template.
        config: the ``data`` section (``messages_key``, ``tools_key``, ``enable_thinking_key``,
            ``enable_thinking_default``, ``max_length``, ``truncation``, ``apply_chat_template_kwargs``,
            ``ignore_input_ids_mismatch``).
        processor: must be None (conversations with images are not supported yet).
        max_samples: keep only the first N rows (-1 = all).

    Each item is ``{"input_ids": [L], "loss_mask": [L]}`` (int64; ``loss_mask`` 1 on the tokens the
    loss predicts).

    Raises:
        DataError: an unreadable file, a row without a well-formed conversation, a conversation over
            ``max_length`` with ``truncation=error``, or a template mismatch (see the module docstring),
            each naming the file, the row and the field.
    """

    def __init__(self, parquet_files: str | Sequence[str], tokenizer: Any, config: Any, processor: Any = None,
                 max_samples: int = -1) -> None:
        if processor is not None:
            raise DataError("SFT on conversations with images is not supported yet; fine-tune a text model")
        files = [parquet_files] if isinstance(parquet_files, (str, Path)) else [str(f) for f in parquet_files]
        located = [(f"{path}, {where}", row) for path in files for where, row in read_located_rows(path)]
        if max_samples is not None and max_samples > 0:
            located = located[:max_samples]
        self.tokenizer = tokenizer
        self.config = config
        self.input_ids: list[list[int]] = []
        self.loss_masks: list[list[int]] = []
        unlearnt = 0
        for where, row in located:
            problem = conversation_problem(row, config.messages_key)
            if problem is not None:
                raise DataError(f"{where} {problem}")
            ids, mask = self._encode(row, where)
            ids, mask = self._truncate(ids, mask, where)
            unlearnt += not any(mask[1:])
            self.input_ids.append(ids)
            self.loss_masks.append(mask)
        if not self.input_ids:
            raise DataError(f"no conversations in {files}: the files have no rows")
        if unlearnt:
            logger.warning("%d of %d conversations in %s have no assistant token left after truncation to "
                           "data.max_length=%d; they add nothing to the loss", unlearnt, len(self.input_ids), files,
                           config.max_length)

    def _render(self, messages: list[dict[str, Any]], tools: Any, thinking: bool | None, generation: bool) -> list[int]:
        kwargs = dict(self.config.apply_chat_template_kwargs or {})
        if thinking is not None:
            kwargs["enable_thinking"] = thinking
        text = self.tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=generation,
                                                  tokenize=False, **kwargs)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _row_options(self, row: dict[str, Any]) -> tuple[Any, bool | None]:
        tools = row.get(self.config.tools_key) or None
        thinking = row.get(self.config.enable_thinking_key, self.config.enable_thinking_default)
        return tools, None if thinking in (None, "none") else bool(thinking)

    def _encode(self, row: dict[str, Any], where: str) -> tuple[list[int], list[int]]:
        """The conversation's ids and loss mask (see the module docstring)."""
        messages = _clean(row[self.config.messages_key])
        tools, thinking = self._row_options(row)
        encoded = self._encode_prefixes(messages, tools, thinking)
        if not isinstance(encoded, _Mismatch):
            return encoded
        if not self.config.ignore_input_ids_mismatch:
            turn, changed, total = encoded
            raise DataError(f"{where}: field {self.config.messages_key}[{turn}]: the chat template renders the turns "
                            f"before it differently once it follows (token {changed} of {total} changes), so a prompt "
                            "of this conversation would not be what generation is given; set "
                            "data.ignore_input_ids_mismatch=true to train on the turns rendered one by one")
        return self._encode_turns(messages, tools, thinking)

    def _encode_prefixes(self, messages: list[dict[str, Any]], tools: Any, thinking: bool | None
                         ) -> tuple[list[int], list[int]] | _Mismatch:
        """``(ids, mask)`` from the conversation rendered whole up to each turn, or, when a turn changes
        the ids before it, where."""
        ids: list[int] = []
        mask: list[int] = []
        for i, message in enumerate(messages):
            upto = self._render(messages[: i + 1], tools, thinking, generation=False)
            keep = _common_prefix(ids, upto)
            if keep < len(ids):
                return _Mismatch(i, keep, len(ids))
            turn = upto[keep:]
            header = 0
            if message["role"] == "assistant":  # its header is the generation prompt: context, not trained
                prompt = self._render(messages[:i], tools, thinking, generation=True)
                header = min(len(turn), max(0, _common_prefix(prompt, upto) - keep))
            ids = upto
            mask += [0] * header + [int(message["role"] == "assistant")] * (len(turn) - header)
        return ids, mask

    def _encode_turns(self, messages: list[dict[str, Any]], tools: Any, thinking: bool | None
                      ) -> tuple[list[int], list[int]]:
        """verl's concatenation: each turn rendered alone (tools with the first), less the prefix the
        template puts before any conversation (a default system prompt); an assistant turn less its
        header (the generation prompt)."""
        user = [{"role": "user", "content": ""}]
        one = self._render(user, None, thinking, generation=False)
        two = self._render(user * 2, None, thinking, generation=False)
        prefix = len(one) - (len(two) - len(one))
        header = len(self._render(user, None, thinking, generation=True)) - len(one)
        ids: list[int] = []
        mask: list[int] = []
        for i, message in enumerate(messages):
            turn = self._render([message], tools if i == 0 else None, thinking, generation=False)
            if i > 0 and message["role"] != "system":
                turn = turn[prefix:]
            skip = min(header, len(turn)) if message["role"] == "assistant" else len(turn)
            ids += turn
            mask += [0] * skip + [1] * (len(turn) - skip)
        return ids, mask

    def _truncate(self, ids: list[int], mask: list[int], where: str) -> tuple[list[int], list[int]]:
        limit = self.config.max_length
        if len(ids) <= limit:
            return ids, mask
        if self.config.truncation == "left":
            return ids[-limit:], mask[-limit:]
        if self.config.truncation == "right":
            return ids[:limit], mask[:limit]
        raise DataError(f"{where}: the conversation has {len(ids)} tokens > data.max_length={limit}; raise "
                        "data.max_length or set data.truncation=left|right")

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": torch.tensor(self.input_ids[index], dtype=torch.long),
                "loss_mask": torch.tensor(self.loss_masks[index], dtype=torch.long)}


def collate_sft_batch(items: Sequence[dict[str, torch.Tensor]], pad_token_id: int, pad_to: int | None = None
                      ) -> dict[str, torch.Tensor]:
    """Conversations as the actor's training batch (see :mod:`rlvr.workers.sft_worker`).

    Args:
        items: ``{"input_ids": [L_i], "loss_mask": [L_i]}`` per conversation.
        pad_to: pad every row to this width (``data.pad_mode=right``: ``data.max_length``); None: to the
            longest row.

    Returns:
        right-padded ``input_ids``, ``attention_mask``, ``position_ids`` ``[B, T]``, and
        ``responses = input_ids[:, 1:]``, ``response_mask = loss_mask[:, 1:]`` ``[B, T - 1]`` (token
        ``t`` is predicted from tokens ``< t``; the first token of a row never is).
    """
    width = max(pad_to or 0, max(len(item["input_ids"]) for item in items), 2)
    ids = torch.full((len(items), width), pad_token_id, dtype=torch.long)
    attention = torch.zeros(len(items), width, dtype=torch.long)
    loss = torch.zeros(len(items), width, dtype=torch.long)
    for row, item in enumerate(items):
        n = len(item["input_ids"])
        ids[row, :n], attention[row, :n], loss[row, :n] = item["input_ids"], 1, item["loss_mask"]
    return {"input_ids": ids, "attention_mask": attention, "position_ids": compute_position_ids(attention),
            "responses": ids[:, 1:].clone(), "response_mask": loss[:, 1:].clone()}


def create_sft_dataset(data_paths: Any, data_config: Any, tokenizer: Any, processor: Any = None,
                       max_samples: int = -1) -> Dataset:
    """The dataset of ``data.train_files`` / ``val_files`` (verl's function): the user's class of
    ``data.custom_cls`` (``path`` a module or .py file, ``name`` the class; built with the same
    arguments, items with ``input_ids`` and ``loss_mask``), else :class:`MultiTurnSFTDataset`."""
    paths = [str(p) for p in data_paths] if not isinstance(data_paths, (str, Path)) else str(data_paths)
    cls: Any = MultiTurnSFTDataset
    if data_config.custom_cls.path:
        try:
            cls = load_object(f"{data_config.custom_cls.path}:{data_config.custom_cls.name}")
        except UserCodeError as err:
            raise DataError(f"data.custom_cls: {err}") from None
    return cls(parquet_files=paths, tokenizer=tokenizer, config=data_config, processor=processor,
               max_samples=max_samples)
