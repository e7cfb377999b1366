"""reasoning-gym scorer: each task scored by its own checker, entry from extra_info or metadata."""

from __future__ import annotations

import pytest

reasoning_gym = pytest.importorskip("reasoning_gym")

from rlvr.reward.scorers import UnknownDataSourceError, default_compute_score  # noqa: E402
from rlvr.reward.scorers.reasoning_gym import extract_answer  # noqa: E402

TASKS = ["basic_arithmetic", "chain_sum", "countdown", "leg_counting"]


@pytest.mark.parametrize("task", TASKS)
def test_task_checker_scores_generated_entries(task):
    checker = reasoning_gym.get_score_answer_fn(task)
    for entry in reasoning_gym.create_dataset(task, size=3, seed=7):
        source = f"reasoning_gym/{task}"
        tagged = f"<think>let me work it out</think><answer>{entry['answer']}</answer>"
        assert default_compute_score(source, tagged, entry["answer"], {"entry": entry}) == {"score": 1.0, "acc": 1.0}
        last_line = f"Working...\n{entry['answer']}\n"
        assert default_compute_score(source, last_line, entry["answer"], {"metadata": entry["metadata"]})["acc"] == 1.0
        wrong = default_compute_score(source, "<answer>123456789</answer>", entry["answer"], {"entry": entry})
        assert wrong["acc"] == 0.0
        assert wrong["score"] == checker("123456789", entry)  # the task's own (partial-credit) value


def test_answer_extraction_rules():
    assert extract_answer("x\n<answer> 5 </answer>\ntrailing") == "5"
    assert extract_answer("<answer>1</answer> then <answer>2</answer>") == "2"
    assert extract_answer("line one\n  42  \n\n") == "42"
    assert extract_answer("<think>unfinished") is None


def test_unknown_task_names_it_and_lists_tasks():
    with pytest.raises(UnknownDataSourceError, match="reasoning_gym/no_such_task.*reasoning_gym/chain_sum"):
        default_compute_score("reasoning_gym/no_such_task", "<answer>1</answer>", "1", {})
