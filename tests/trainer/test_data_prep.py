"""Preprocessing: reasoning-gym tasks and GSM8K into the common RL format, scored by rlvr's scorers."""

from __future__ import annotations

import json

import pytest

from rlvr.data_prep import gsm8k
from rlvr.data_prep import reasoning_gym as rg_prep
from rlvr.trainer.data import read_rows
from rlvr.utils.reward_score import default_compute_score


def test_reasoning_gym_addition_rows_are_held_out_and_scorable(tmp_path):
    rg_prep.main(["--out", str(tmp_path), "--train-size", "50", "--test-size", "10"])
    train, test = read_rows(tmp_path / "train.jsonl"), read_rows(tmp_path / "test.jsonl")
    assert (len(train), len(test)) == (50, 10)
    assert not {r["extra_info"]["question"] for r in test} & {r["extra_info"]["question"] for r in train}
    row = test[0]
    assert row["data_source"] == "reasoning_gym/basic_arithmetic"
    question = row["extra_info"]["question"]
    a, b = question.removeprefix("Calculate ").rstrip(".").split(" + ")
    assert 0 <= int(a) <= 99 and 0 <= int(b) <= 99
    assert row["reward_model"]["ground_truth"] == str(int(a) + int(b))
    assert row["prompt"] == [{"role": "user", "content": f"{question} Answer with just the number, no words."}]

    def score(response: str) -> dict:
        return default_compute_score(row["data_source"], response, row["reward_model"]["ground_truth"],
                                     row["extra_info"])

    truth = row["reward_model"]["ground_truth"]
    assert score(truth)["acc"] == 1.0
    assert score(str(int(truth) + 1))["score"] == 0.0
    assert 0 < score(f"{a} + {b} = {truth}")["score"] < 1  # the checker's partial credit for extra text


def test_reasoning_gym_other_task_and_parquet(tmp_path):
    rg_prep.build("chain_sum", tmp_path, 8, 4, seed=3, config={"max_digits": 1}, fmt="parquet")
    rows = read_rows(tmp_path / "test.parquet")
    assert len(rows) == 4 and rows[0]["data_source"] == "reasoning_gym/chain_sum"
    truth = rows[0]["reward_model"]["ground_truth"]
    assert default_compute_score(rows[0]["data_source"], truth, truth, rows[0]["extra_info"])["acc"] == 1.0


def test_gsm8k_from_local_files(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    record = {"question": "Tom has 1,200 apples and buys 3. How many?", "answer": "1200 + 3 = 1203\n#### 1,203"}
    for split in ("train", "test"):
        (src / f"{split}.jsonl").write_text(json.dumps(record) + "\n")
    gsm8k.main(["--local-dir", str(src), "--out", str(tmp_path / "out"), "--format", "jsonl"])
    row = read_rows(tmp_path / "out" / "test.jsonl")[0]
    assert row["reward_model"]["ground_truth"] == "1203"
    assert row["data_source"] == "openai/gsm8k"
    assert row["prompt"][0]["content"].startswith("Tom has 1,200 apples") and '"####"' in row["prompt"][0]["content"]
    assert default_compute_score("openai/gsm8k", "so #### 1203", "1203", row["extra_info"])["score"] == 1.0
    with pytest.raises(ValueError, match="without '####'"):
        gsm8k.extract_solution("no marker")
