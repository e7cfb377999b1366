"""The SFT conversations: the loss on exactly the assistant tokens (their header excluded, their end
of turn included), tools and enable_thinking passed to the chat template, templates that re-render
earlier turns, truncation, the batch layout, and bad rows named by file, row and field."""

from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf

from rlvr.trainer.config.sft_schema import SFTConfig
from rlvr.trainer.data import write_rows
from rlvr.trainer.data.sft_dataset import MultiTurnSFTDataset, collate_sft_batch, create_sft_dataset
from rlvr.utils.errors import DataError
from rlvr.utils.testing import TINY_CHAT_TEMPLATE, tiny_tokenizer

CHAT = [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
        {"role": "tool", "content": "T"}, {"role": "assistant", "content": "ok"}]


def data_config(**overrides):
    config = OmegaConf.structured(SFTConfig).data
    for key, value in overrides.items():
        OmegaConf.update(config, key, value)
    return config


def encode(tmp_path, rows, tokenizer=None, suffix=".jsonl", **overrides) -> MultiTurnSFTDataset:
    path = tmp_path / f"chats{suffix}"
    write_rows(rows, path)
    return MultiTurnSFTDataset(str(path), tokenizer or tiny_tokenizer(), data_config(**overrides))


def trained_text(tokenizer, item) -> str:
    return tokenizer.decode([t for t, m in zip(item["input_ids"].tolist(), item["loss_mask"].tolist()) if m])


def test_loss_covers_assistant_turns_only(tmp_path):
    tokenizer = tiny_tokenizer()
    item = encode(tmp_path, [{"messages": CHAT}])[0]
    whole = tokenizer.apply_chat_template(CHAT, tokenize=False)
    assert item["input_ids"].tolist() == tokenizer(whole, add_special_tokens=False)["input_ids"]
    assert trained_text(tokenizer, item) == "yo<|im_end|>\nok<|im_end|>\n"
    mask = item["loss_mask"].tolist()  # byte tokens: the header '<|im_start|>assistant\n' is 11 tokens, untrained
    start = len(tokenizer("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
                          add_special_tokens=False)["input_ids"])
    assert mask[start - 1] == 0 and mask[start : start + 4] == [1, 1, 1, 1] and mask[start + 4] == 0


def test_parquet_rows_with_tool_calls_and_null_fields(tmp_path):
    """A parquet file gives every message every struct field (null where absent); null content is
    allowed for an assistant turn that calls tools."""
    template = TINY_CHAT_TEMPLATE.replace("message['content']",
                                          "(message['content'] or 'CALL ' + message['tool_calls'][0]['name'])")
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = template
    chat = [{"role": "user", "content": "add"}, {"role": "assistant", "content": None, "tool_calls": [{"name": "calc"}]},
            {"role": "tool", "content": "3"}, {"role": "assistant", "content": "three"}]
    item = encode(tmp_path, [{"messages": chat}], tokenizer, suffix=".parquet")[0]
    assert trained_text(tokenizer, item) == "CALL calc<|im_end|>\nthree<|im_end|>\n"


def test_tools_and_enable_thinking_reach_the_template(tmp_path):
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = ("{% if tools %}{{ 'TOOLS ' + tools|length|string + '\n' }}{% endif %}"
                               "{% if enable_thinking is defined and enable_thinking %}{{ 'THINK\n' }}{% endif %}"
                               + TINY_CHAT_TEMPLATE)
    rows = [{"messages": CHAT[1:3], "tools": [{"name": "a"}, {"name": "b"}], "enable_thinking": True},
            {"messages": CHAT[1:3]}]
    dataset = encode(tmp_path, rows, tokenizer)
    assert tokenizer.decode(dataset[0]["input_ids"]).startswith("TOOLS 2\nTHINK\n<|im_start|>user")
    assert tokenizer.decode(dataset[1]["input_ids"]).startswith("<|im_start|>user")
    assert trained_text(tokenizer, dataset[0]) == "yo<|im_end|>\n"
    with_default = encode(tmp_path, rows[1:], tokenizer, enable_thinking_default=True)
    assert tokenizer.decode(with_default[0]["input_ids"]).startswith("THINK\n")


STRIP_THINKING = ("{% for m in messages %}{% if m['role'] == 'assistant' and not loop.last %}"
                  "{{ '<|im_start|>assistant\n' + m['content'].split('</think>')[-1] + '<|im_end|>\n' }}"
                  "{% else %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endif %}"
                  "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def test_a_template_that_rewrites_earlier_turns_is_named_or_concatenated(tmp_path):
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = STRIP_THINKING
    chat = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "<think>x</think>A"},
            {"role": "user", "content": "b"}, {"role": "assistant", "content": "B"}]
    with pytest.raises(DataError, match=r"chats.jsonl, line 1: field messages\[2\]: the chat template renders"):
        encode(tmp_path, [{"messages": chat}], tokenizer)
    item = encode(tmp_path, [{"messages": chat}], tokenizer, ignore_input_ids_mismatch=True)[0]
    turns = ("<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\n<think>x</think>A<|im_end|>\n"
             "<|im_start|>user\nb<|im_end|>\n<|im_start|>assistant\nB<|im_end|>\n")
    assert tokenizer.decode(item["input_ids"]) == turns  # each turn as rendered when it was the last
    assert trained_text(tokenizer, item) == "<think>x</think>A<|im_end|>\nB<|im_end|>\n"


BAD_ROWS = [
    ({"chat": CHAT}, "has no 'messages' field"),
    ({"messages": "hello"}, "field 'messages' must be a non-empty list of messages"),
    ({"messages": []}, "field 'messages' must be a non-empty list"),
    ({"messages": [CHAT[1], "hi"]}, r"field messages\[1\] is not a message object but str"),
    ({"messages": [CHAT[1], {"content": "x"}]}, r"field messages\[1\].role is None"),
    ({"messages": [CHAT[1], {"role": "bot", "content": "x"}]}, r"field messages\[1\].role is 'bot'"),
    ({"messages": [CHAT[1], {"role": "assistant", "content": 7}]}, r"field messages\[1\].content must be a string"),
    ({"messages": [CHAT[0], CHAT[1]]}, "field 'messages' has no assistant message"),
]
PARQUET_ROWS = [0, 2, 4, 5, 7]  # the rows a parquet file can hold beside a good one (one type per column)


@pytest.mark.parametrize(("row", "message"), BAD_ROWS)
def test_bad_jsonl_rows_are_named_by_file_line_and_field(tmp_path, row, message):
    with pytest.raises(DataError, match=f"chats.jsonl, line 2 {message}"):
        encode(tmp_path, [{"messages": CHAT}, row])


@pytest.mark.parametrize(("row", "message"), [BAD_ROWS[i] for i in PARQUET_ROWS])
def test_bad_parquet_rows_are_named_by_file_row_and_field(tmp_path, row, message):
    with pytest.raises(DataError, match=f"chats.parquet, row 1 {message}"):
        encode(tmp_path, [{"messages": CHAT}, row], suffix=".parquet")


def test_long_conversations_error_or_truncate(tmp_path):
    tokenizer = tiny_tokenizer()
    whole = encode(tmp_path, [{"messages": CHAT}])[0]["input_ids"].tolist()
    with pytest.raises(DataError, match=f"line 1: the conversation has {len(whole)} tokens > data.max_length=20"):
        encode(tmp_path, [{"messages": CHAT}], max_length=20)
    left = encode(tmp_path, [{"messages": CHAT}], max_length=20, truncation="left")[0]
    right = encode(tmp_path, [{"messages": CHAT}], max_length=20, truncation="right")[0]
    assert left["input_ids"].tolist() == whole[-20:] and right["input_ids"].tolist() == whole[:20]
    assert trained_text(tokenizer, left) == "ok<|im_end|>\n" and not right["loss_mask"].any()


def test_batch_layout_shifts_the_mask_onto_predicted_tokens():
    items = [{"input_ids": torch.tensor([5, 6, 7, 8]), "loss_mask": torch.tensor([0, 0, 1, 1])},
             {"input_ids": torch.tensor([9, 10]), "loss_mask": torch.tensor([0, 1])}]
    batch = collate_sft_batch(items, pad_token_id=0)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8], [9, 10, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert batch["position_ids"][:, :2].tolist() == [[0, 1], [0, 1]]
    assert batch["responses"].tolist() == [[6, 7, 8], [10, 0, 0]]
    assert batch["response_mask"].tolist() == [[0, 1, 1], [1, 0, 0]]
    assert collate_sft_batch(items, pad_token_id=0, pad_to=6)["input_ids"].shape == (2, 6)


def test_custom_dataset_class(tmp_path):
    module = tmp_path / "my_data.py"
    module.write_text(
        "import torch\n"
        "class Fixed:\n"
        "    def __init__(self, parquet_files, tokenizer, config, processor, max_samples):\n"
        "        self.files = parquet_files\n"
        "    def __len__(self):\n        return 3\n"
        "    def __getitem__(self, i):\n"
        "        return {'input_ids': torch.tensor([1, 2, 3 + i]), 'loss_mask': torch.tensor([0, 1, 1])}\n")
    config = data_config(**{"custom_cls.path": str(module), "custom_cls.name": "Fixed"})
    dataset = create_sft_dataset(["a.parquet"], config, tiny_tokenizer())
    assert type(dataset).__name__ == "Fixed" and dataset.files == ["a.parquet"] and dataset[2]["input_ids"][-1] == 5
    config.custom_cls.name = "Missing"
    with pytest.raises(DataError, match="data.custom_cls: .*has no 'Missing'"):
        create_sft_dataset(["a.parquet"], config, tiny_tokenizer())


def test_jsonl_that_is_not_json_names_the_line(tmp_path):
    path = tmp_path / "chats.jsonl"
    path.write_text(json.dumps({"messages": CHAT}) + "\n{oops\n")
    with pytest.raises(DataError, match="chats.jsonl, line 2: not valid JSON"):
        MultiTurnSFTDataset(str(path), tiny_tokenizer(), data_config())
