"""RL dataset (JSONL/parquet, chat template, left padding, over-long filtering), collation, seeded
order and a resumable batch position."""

from __future__ import annotations

import json
import logging
import re

import numpy as np
import pytest
import torch
from trainer_helpers import write_tiny_dataset

from rlvr.protocol import DataProto
from rlvr.trainer.config import load_config
from rlvr.trainer.data import (
    RLHFDataset,
    SeededRandomSampler,
    StatefulBatchIterator,
    collate_fn,
    read_rows,
    write_rows,
)
from rlvr.utils.errors import DataError
from rlvr.utils.testing import tiny_tokenizer


@pytest.fixture
def data_cfg():
    return load_config(None, ["data.max_prompt_length=40"]).data


def test_dataset_tokenises_with_chat_template_and_left_pads(tmp_path, data_cfg):
    tok = tiny_tokenizer()
    rows = read_rows(write_tiny_dataset(tmp_path / "d.jsonl", 12))
    rows[0]["prompt"] = [{"role": "user", "content": "x"}]  # the shortest prompt
    write_rows(rows, tmp_path / "d.parquet")
    ds = RLHFDataset(str(tmp_path / "d.parquet"), tok, data_cfg)
    assert len(ds) == 12
    text = "<|im_start|>user\nsay 7 1<|im_end|>\n<|im_start|>assistant\n"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    item = ds[1]
    assert ds.prompt_length == len(ids) + 1  # "say 7 10".."say 7 11" are one byte longer
    assert item["input_ids"].tolist() == [tok.pad_token_id] + ids
    assert item["attention_mask"].tolist() == [0] + [1] * len(ids)
    assert item["position_ids"].tolist() == [0] + list(range(len(ids)))
    assert item["reward_model"]["ground_truth"] == "7" and item["data_source"] == "tiny"
    assert item["raw_prompt"] == [{"role": "user", "content": "say 7 1"}]
    short = ds[0]
    # <|im_start|> "user\nx" <|im_end|> "\n" <|im_start|> "assistant\n": 1 + 6 + 1 + 1 + 1 + 10 tokens
    assert short["attention_mask"].sum().item() == 20


def test_overlong_prompts_are_filtered_with_a_count(tmp_path, caplog):
    path = write_tiny_dataset(tmp_path / "d.jsonl", 12)
    cfg = load_config(None, ["data.max_prompt_length=26"]).data  # "say d i": 26 tokens for i < 10, 27 for i >= 10
    with caplog.at_level(logging.WARNING):
        ds = RLHFDataset(str(path), tiny_tokenizer(), cfg)
    assert (len(ds), ds.num_filtered) == (10, 2)
    assert "dropped 2 of 12 prompts longer than data.max_prompt_length=26 tokens" in caplog.text
    cfg = load_config(None, ["data.max_prompt_length=26", "data.filter_overlong_prompts=False",
                             "data.truncation=left"]).data
    ds = RLHFDataset(str(path), tiny_tokenizer(), cfg)
    assert len(ds) == 12 and ds.prompt_length == 26
    cfg = load_config(None, ["data.max_prompt_length=26", "data.filter_overlong_prompts=False"]).data
    with pytest.raises(DataError, match=r"d\.jsonl, line 11: the prompt has 27 tokens > data\.max_prompt_length=26"):
        RLHFDataset(str(path), tiny_tokenizer(), cfg)


GOOD = {"data_source": "tiny", "prompt": [{"role": "user", "content": "hi"}], "reward_model": {"ground_truth": "1"}}


BAD_ROWS = [
    ({"prompt": None}, "field 'prompt' must be a non-empty list of chat messages"),
    ({"prompt": []}, "field 'prompt' must be a non-empty list of chat messages"),
    ({"prompt": [{"role": "user"}]}, "field 'prompt' must be a non-empty list of chat messages"),
    ({"data_source": None}, "has no 'data_source' string field"),
    ({"reward_model": {"style": "rule"}}, "has no 'reward_model.ground_truth' field"),
]


@pytest.mark.parametrize(("suffix", "change", "message"), [
    *[(".jsonl", *case) for case in BAD_ROWS],
    *[(".parquet", *case) for case in BAD_ROWS],
    (".jsonl", {"reward_model": "7"}, "has no 'reward_model.ground_truth' field"),  # a parquet column has one type
])
def test_a_bad_row_names_file_row_and_field(tmp_path, data_cfg, suffix, change, message):
    path = tmp_path / f"bad{suffix}"
    write_rows([dict(GOOD), dict(GOOD), {**GOOD, **change}], path)
    where = "line 3" if suffix == ".jsonl" else "row 2"
    with pytest.raises(DataError, match=re.escape(f"{path}, {where} {message}")):
        RLHFDataset(str(path), tiny_tokenizer(), data_cfg)


def test_a_missing_prompt_field_is_named(tmp_path, data_cfg):
    write_rows([GOOD, {"question": "hi", "data_source": "x", "reward_model": {"ground_truth": 1}}], tmp_path / "d.jsonl")
    with pytest.raises(DataError, match=r"d\.jsonl, line 2 has no 'prompt' field \(the prompt; data\.prompt_key"):
        RLHFDataset(str(tmp_path / "d.jsonl"), tiny_tokenizer(), data_cfg)
    cfg = load_config(None, ["data.prompt_key=question", "data.apply_chat_template=False"]).data
    write_rows([{**GOOD, "question": "hi"}], tmp_path / "q.jsonl")
    assert len(RLHFDataset(str(tmp_path / "q.jsonl"), tiny_tokenizer(), cfg)) == 1  # a plain string prompt


def test_malformed_json_names_file_and_line(tmp_path, data_cfg):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(GOOD) + "\n\n" + '{"prompt": [1, 2\n')
    with pytest.raises(DataError, match=r"d\.jsonl, line 3: not valid JSON \(.* at column \d+\)"):
        RLHFDataset(str(path), tiny_tokenizer(), data_cfg)
    path.write_text(json.dumps(GOOD) + "\n[1, 2]\n")
    with pytest.raises(DataError, match=r"d\.jsonl, line 2 is not an object with fields but a list"):
        RLHFDataset(str(path), tiny_tokenizer(), data_cfg)


def test_unreadable_parquet_is_reported(tmp_path, data_cfg):
    path = tmp_path / "d.parquet"
    write_rows([GOOD] * 3, path)
    path.write_bytes(path.read_bytes()[:40])  # truncated file
    with pytest.raises(DataError, match=r"d\.parquet: not a readable parquet file"):
        RLHFDataset(str(path), tiny_tokenizer(), data_cfg)


def test_no_prompts_left_is_an_error(tmp_path):
    path = write_tiny_dataset(tmp_path / "d.jsonl", 4)
    cfg = load_config(None, ["data.max_prompt_length=10"]).data
    with pytest.raises(DataError, match=r"no prompts left in .*: all 4 prompts are longer than "
                                        r"data\.max_prompt_length=10 tokens \(the shortest has 26\)"):
        RLHFDataset(str(path), tiny_tokenizer(), cfg)
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DataError, match="the files have no rows"):
        RLHFDataset(str(tmp_path / "empty.jsonl"), tiny_tokenizer(), cfg)


def test_collate_builds_a_dataproto(tmp_path, data_cfg):
    ds = RLHFDataset(str(write_tiny_dataset(tmp_path / "d.jsonl", 5)), tiny_tokenizer(), data_cfg)
    batch = DataProto.from_single_dict(collate_fn([ds[i] for i in range(3)]))
    assert batch.batch["input_ids"].shape == (3, ds.prompt_length)
    assert batch.non_tensor_batch["data_source"].tolist() == ["tiny"] * 3
    assert batch.non_tensor_batch["index"].tolist() == [0, 1, 2]


def test_seeded_sampler_depends_on_seed_and_epoch():
    data = list(range(10))
    a, b = SeededRandomSampler(data, seed=3), SeededRandomSampler(data, seed=3)
    assert list(a) == list(b) == torch.randperm(10, generator=torch.Generator().manual_seed(3)).tolist()
    b.set_epoch(1)
    assert list(b) == torch.randperm(10, generator=torch.Generator().manual_seed(4)).tolist()
    assert list(SeededRandomSampler(data, seed=3, shuffle=False)) == data


def test_batch_iterator_resumes_at_the_saved_position():
    data = list(range(10))

    def make():
        return StatefulBatchIterator(data, 3, SeededRandomSampler(data, seed=5), collate_fn=list)

    full = make()
    batches = [next(full) for _ in range(7)]  # 3 batches per epoch: crosses two epoch boundaries
    assert len(full) == 3
    epoch0 = torch.randperm(10, generator=torch.Generator().manual_seed(5)).tolist()
    assert batches[:3] == [epoch0[0:3], epoch0[3:6], epoch0[6:9]]
    part = make()
    for _ in range(4):
        next(part)
    state = part.state_dict()
    assert state == {"epoch": 1, "batches_in_epoch": 1}
    resumed = make()
    resumed.load_state_dict(state)
    assert [next(resumed) for _ in range(3)] == batches[4:7]


def test_batch_iterator_needs_one_full_batch():
    with pytest.raises(DataError, match="fewer than one batch of data.train_batch_size=4"):
        StatefulBatchIterator([1, 2], 4, SeededRandomSampler([1, 2], seed=0), collate_fn=list)


def test_collate_keeps_dicts_as_objects():
    out = collate_fn([{"x": torch.zeros(2), "d": {"a": 1}}, {"x": torch.ones(2), "d": {"a": 2}}])
    assert out["x"].shape == (2, 2)
    assert out["d"].dtype == np.dtype(object) and out["d"][1] == {"a": 2}
