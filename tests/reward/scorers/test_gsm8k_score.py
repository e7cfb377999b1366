"""GSM8K scorer: verl's strict and flexible extraction (string comparison, the last 300 characters),
the lenient option, on real GSM8K ground truths and adversarial responses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlvr.reward.scorers import ScorerArgumentError, default_compute_score
from rlvr.reward.scorers.gsm8k import compute_score, extract_solution, ground_truth_answer, normalize_number

GSM8K_TEST = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "gsm8k" / "test.jsonl"


@pytest.fixture(scope="module")
def gsm8k_records() -> list[dict]:
    if not GSM8K_TEST.is_file():
        pytest.skip(f"GSM8K test split not found at {GSM8K_TEST} (the shared data directory is not checked out)")
    with GSM8K_TEST.open() as f:
        return [json.loads(line) for _, line in zip(range(60), f)]


def _gt(record: dict) -> str:
    """The ground truth as the GSM8K data prep writes it: the number after ``####``, commas removed."""
    return record["answer"].rsplit("####", 1)[1].strip().replace(",", "")


def test_reference_solutions_score_one(gsm8k_records):
    for record in gsm8k_records:
        assert compute_score(record["answer"][-300:], _gt(record)) == 1.0
        assert default_compute_score("openai/gsm8k", record["answer"], _gt(record)) == 1.0
        assert compute_score(record["answer"], record["answer"], method="lenient") == 1.0


def test_wrong_and_malformed_responses_score_zero(gsm8k_records):
    for record in gsm8k_records:
        gt = ground_truth_answer(_gt(record))
        assert compute_score(f"The answer is\n#### {gt + 1:g}", _gt(record)) == 0.0
        no_marker = record["answer"].rsplit("####", 1)[0] + f"So the answer is {gt:g}"
        assert compute_score(no_marker, _gt(record), method="strict") == 0.0
        assert compute_score(no_marker, _gt(record), method="flexible") == 1.0
        assert compute_score("####", _gt(record)) == 0.0
        assert compute_score("", _gt(record)) == 0.0


def test_strict_mode_is_verls_regex():
    # the marker, exactly one space, then the number: no space, a newline or two spaces hold no answer
    assert compute_score("####10", "10") == 0.0
    assert compute_score("####\n9", "9") == 0.0
    assert compute_score("####  9", "9") == 0.0
    assert compute_score("#### 10", "10") == 1.0
    assert compute_score("#### 9\n#### 10", "10") == 1.0  # the last marker counts
    assert compute_score("#### 10\n#### 9", "10") == 0.0
    assert compute_score("#### 1,000", "1000") == 1.0  # thousands separators removed
    assert compute_score("#### 10 apples", "10") == 1.0
    # string comparison, as in verl: a reformatted number is wrong, a found-but-wrong answer gets format_score
    assert compute_score("#### 18.00", "18") == 0.0
    assert compute_score("#### 72.", "72") == 0.0
    assert compute_score("#### $18", "18") == 0.0
    assert compute_score("#### 7", "72", format_score=0.1) == 0.1
    assert compute_score("#### 72", "72", score=2.0) == 2.0
    # only the last 300 characters are read
    assert compute_score("#### 72\n" + "x" * 293, "72") == 0.0  # 301 characters: the marker's first '#' is cut
    assert compute_score("#### 72\n" + "x" * 292, "72") == 1.0
    assert extract_solution("#### -3.5 m") == "-3.5"
    assert extract_solution("nothing here") is None
    # think sections are not removed in verl's modes
    assert compute_score("<think>#### 72</think>", "72") == 1.0


def test_flexible_mode_takes_the_last_number():
    assert extract_solution("it was 3 then 4 apples", method="flexible") == "4"
    assert extract_solution("it was 3 then 4.", method="flexible") == "4."
    assert extract_solution("no digits . at all", method="flexible") is None
    assert default_compute_score("gsm8k_flexible", "so 3 + 4 = 7", "7") == 1.0


def test_lenient_mode_is_an_option():
    for response in ("####10", "####\n10", "#### $10", "#### 10.", "#### 10.00", "x #### 10 dollars"):
        assert compute_score(response, "10", method="lenient") == 1.0, response
        assert default_compute_score("gsm8k_lenient", response, "10") == 1.0
    assert compute_score("#### 1,000", "Step one.\n#### 1,000", method="lenient") == 1.0
    assert compute_score("<think>#### 10</think>\n#### 11", "10", method="lenient") == 0.0
    assert compute_score("#### 10\n" + "x" * 400, "10", method="lenient") == 1.0  # no 300-character window
    with pytest.raises(ValueError, match="not a number"):
        compute_score("#### 1", "seventy", method="lenient")


def test_numbers_and_bad_arguments():
    assert normalize_number("$1,234.50") == 1234.5
    assert normalize_number("18.00") == 18.0
    assert normalize_number("72.") == 72.0
    assert normalize_number("abc") is None
    assert ground_truth_answer("Step one.\n#### 1,000") == 1000.0
    with pytest.raises(ScorerArgumentError, match="method"):
        extract_solution("#### 1", method="loose")
    with pytest.raises(AssertionError):  # verl asserts the method
        compute_score("#### 1", "1", method="loose")
