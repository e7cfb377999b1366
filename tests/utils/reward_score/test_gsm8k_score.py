"""GSM8K scorer: strict/flexible extraction on real GSM8K ground truths and adversarial responses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlvr.utils.reward_score import default_compute_score
from rlvr.utils.reward_score.gsm8k import compute_score, extract_solution, ground_truth_answer, normalize_number

GSM8K_TEST = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "gsm8k" / "test.jsonl"


@pytest.fixture(scope="module")
def gsm8k_records() -> list[dict]:
    if not GSM8K_TEST.is_file():
        pytest.skip(f"GSM8K test split not found at {GSM8K_TEST} (the shared data directory is not checked out)")
    with GSM8K_TEST.open() as f:
        return [json.loads(line) for _, line in zip(range(60), f)]


def _gt(record: dict) -> str:
    return record["answer"].rsplit("####", 1)[1].strip()


def test_reference_solutions_score_one(gsm8k_records):
    for record in gsm8k_records:
        assert compute_score(record["answer"], _gt(record)) == {"score": 1.0, "acc": 1.0}
        assert default_compute_score("openai/gsm8k", record["answer"], _gt(record))["score"] == 1.0


def test_wrong_and_malformed_responses_score_zero(gsm8k_records):
    for record in gsm8k_records:
        gt = ground_truth_answer(_gt(record))
        assert compute_score(f"The answer is\n#### {gt + 1:g}", _gt(record))["score"] == 0.0
        no_marker = record["answer"].rsplit("####", 1)[0] + f"So the answer is {gt:g}"
        assert compute_score(no_marker, _gt(record), method="strict")["score"] == 0.0
        assert compute_score(no_marker, _gt(record), method="flexible")["score"] == 1.0
        assert compute_score("####", _gt(record))["score"] == 0.0
        assert compute_score("", _gt(record))["score"] == 0.0


def test_adversarial_formats(gsm8k_records):
    for record in gsm8k_records:
        gt = _gt(record)
        value = ground_truth_answer(gt)
        with_commas = f"{value:,.0f}" if value == int(value) else f"{value:,}"
        assert compute_score(f"#### {value + 3:g}\n#### {gt}", gt)["score"] == 1.0  # last #### wins
        assert compute_score(f"#### {gt}\n#### {value + 3:g}", gt)["score"] == 0.0
        assert compute_score(f"#### {with_commas}", gt)["score"] == 1.0
        assert compute_score(f"#### ${gt}", gt)["score"] == 1.0
        assert compute_score(f"#### {gt} dollars in total. Hope this helps!", gt)["score"] == 1.0
        assert compute_score(f"#### {gt}.", gt)["score"] == 1.0
        assert compute_score(f"<think>#### {gt}</think>\n#### {value + 1:g}", gt)["score"] == 0.0


def test_numbers_and_extraction_rules():
    assert normalize_number("$1,234.50") == 1234.5
    assert normalize_number("18.00") == 18.0
    assert normalize_number("72.") == 72.0
    assert normalize_number("abc") is None
    assert extract_solution("#### -3.5 m") == "-3.5"
    assert extract_solution("nothing here") is None
    assert extract_solution("it was 3 then 4 apples", method="flexible") == "4"
    assert ground_truth_answer("Step one.\n#### 1,000") == 1000.0
    assert compute_score("#### 18.00", "18")["acc"] == 1.0
    assert compute_score("#### 7", "72", format_score=0.1) == {"score": 0.1, "acc": 0.0}
    with pytest.raises(ValueError, match="method"):
        extract_solution("#### 1", method="lenient")
    with pytest.raises(ValueError, match="not a number"):
        compute_score("#### 1", "seventy")
