"""Scorer registry, text helpers, multiple-choice and countdown scorers."""

from __future__ import annotations

import pytest

from rlvr.reward.scorers import (
    SCORER_REGISTRY,
    UnknownDataSourceError,
    default_compute_score,
    get_scorer,
    register_scorer,
)
from rlvr.reward.scorers.countdown import check_equation
from rlvr.reward.scorers.multiple_choice import extract_choice
from rlvr.reward.scorers.text import last_boxed, strip_think


def test_unknown_data_source_names_it_and_lists_known():
    with pytest.raises(UnknownDataSourceError) as info:
        default_compute_score("my/secret_set", "x", "y")
    message = str(info.value)
    assert "'my/secret_set'" in message and "openai/gsm8k" in message and "countdown" in message


def test_register_scorer_names_and_families():
    @register_scorer(["test_rule_scores/a", "test_rule_scores_family/*"])
    def constant(data_source, solution_str, ground_truth, extra_info=None):
        return 0.25

    assert get_scorer("test_rule_scores/a") is constant
    assert default_compute_score("test_rule_scores_family/anything", "", "") == 0.25
    with pytest.raises(ValueError, match="already registered"):
        register_scorer("test_rule_scores/a")(lambda data_source, solution_str, ground_truth, extra_info=None: 0.5)
    assert register_scorer("test_rule_scores/a")(constant) is constant  # the same function again: a no-op
    assert "test_rule_scores/a" in SCORER_REGISTRY.names()


def test_text_helpers():
    assert strip_think("<think>a</think>b<think>c</think>d") == "bd"
    assert strip_think("a<think>never closed") == "a"
    assert strip_think("reasoning in the template</think>answer") == "answer"
    assert last_boxed(r"\boxed{1} and \boxed{\frac{a}{b}}") == r"\frac{a}{b}"
    assert last_boxed(r"\boxed{unbalanced") is None
    assert last_boxed("none") is None


@pytest.mark.parametrize(
    "response,choice",
    [
        (r"so \boxed{B}", "B"),
        (r"\boxed{\text{C}}", "C"),
        ("<answer>(d)</answer>", "D"),
        ("Reasoning... The answer is (A).", "A"),
        ("Answer: **E**", "E"),
        ("lots of text\nB.", "B"),
        ("A is wrong, C is wrong, so I don't know", None),
        ("<think>The answer is A</think> no answer", None),
    ],
)
def test_multiple_choice_extraction(response, choice):
    assert extract_choice(response) == choice


def test_multiple_choice_scores():
    assert default_compute_score("multiple_choice", r"\boxed{B}", "(b)") == {"score": 1.0, "acc": 1.0}
    assert default_compute_score("multiple_choice", r"\boxed{C}", "B) Paris")["score"] == 0.0
    with pytest.raises(ValueError, match="option letter"):
        default_compute_score("multiple_choice", r"\boxed{C}", "Paris")


def test_countdown_equations():
    truth = {"target": 24, "numbers": [3, 4, 6, 2]}
    assert default_compute_score("countdown", "<answer>(6 / 3 + 4) * 2 + 12 - 12</answer>", truth)["score"] == 0.0
    assert default_compute_score("countdown", "<think>try</think><answer>(6 - 2) * (4 + 2)</answer>", truth)["score"] == 0.0
    assert default_compute_score("countdown", "<answer>6 * 4 * (3 - 2)</answer>", truth) == {"score": 1.0, "acc": 1.0}
    assert default_compute_score("countdown", "<answer>6 * 4 * (3 - 2) = 24</answer>", truth)["score"] == 1.0
    assert default_compute_score("countdown", "6 * 4 * (3 - 2)", truth)["score"] == 0.0  # no <answer> tag
    assert check_equation("(6 / 4) * 8 * 2", 24, [6, 4, 8, 2])  # exact fractions
    assert not check_equation("6 * 4", 24, [6, 4, 8])  # a number left unused
    assert not check_equation("6 ** 4", 1296, [6, 4])  # only + - * /
    assert not check_equation("__import__('os')", 0, [])
    assert not check_equation("6 / (4 - 4)", 0, [6, 4, 4])
    assert not check_equation("(" * 500 + "1" + ")" * 500, 1, [1])
