"""Math scorer: math-verify equivalence, <think> handling, unparseable input, the time limit."""

from __future__ import annotations

import threading
import time

import pytest

from rlvr.reward.scorers import ScorerTimeoutError, default_compute_score
from rlvr.reward.scorers import math as math_score

PATHOLOGICAL = r"The answer is \boxed{9^{9^{9^{9}}}}"


@pytest.mark.parametrize("answer", [r"\frac{1}{2}", "0.5", "1/2", r"\dfrac{1}{2}", r"\frac{2}{4}"])
def test_equivalent_forms_are_correct(answer):
    assert math_score.compute_score(f"so we get \\boxed{{{answer}}}", r"\frac{1}{2}") == {"score": 1.0, "acc": 1.0}


@pytest.mark.parametrize(
    "response",
    [r"\boxed{2/3}", r"\boxed{-\frac{1}{2}}", r"\boxed{1/2} wait, no: \boxed{3}", "the answer is 1/2", r"\boxed{x+", r"\boxed{}", ""],
)
def test_wrong_missing_or_unparseable_score_zero(response):
    assert math_score.compute_score(response, r"\frac{1}{2}")["score"] == 0.0


def test_last_box_and_think_sections():
    assert math_score.compute_score(r"\boxed{3} hmm, actually \boxed{\sqrt{4}}", "2")["score"] == 1.0
    assert math_score.compute_score(r"<think>\boxed{2}</think> final: \boxed{3}", "2")["score"] == 0.0
    assert math_score.compute_score(r"<think>maybe \boxed{3}</think> final: \boxed{2}", "2")["score"] == 1.0
    assert math_score.compute_score(r"<think>still thinking \boxed{2}", "2")["score"] == 0.0
    assert default_compute_score("lighteval/MATH", r"\boxed{\pi}", r"\pi")["score"] == 1.0


def test_pathological_expression_is_bounded_by_the_timeout():
    start = time.monotonic()
    with pytest.raises(ScorerTimeoutError, match="gave up after 1 s"):
        math_score.compute_score(PATHOLOGICAL, "3", timeout_s=1.0)
    assert time.monotonic() - start < 10.0


def test_off_main_thread_runs_in_a_killable_helper_process():
    results: dict[str, object] = {}

    def work() -> None:
        results["ok"] = math_score.compute_score(r"\boxed{0.5}", r"\frac{1}{2}", timeout_s=1.0)
        try:
            math_score.compute_score(PATHOLOGICAL, "3", timeout_s=1.0)
        except ScorerTimeoutError as exc:
            results["timeout"] = exc

    thread = threading.Thread(target=work)
    try:
        thread.start()
        thread.join(timeout=60)
        assert not thread.is_alive()
        assert results["ok"] == {"score": 1.0, "acc": 1.0}
        assert isinstance(results["timeout"], ScorerTimeoutError)
    finally:
        math_score.close_helper_pool()


def test_unparseable_ground_truth_is_a_data_error():
    with pytest.raises(ValueError, match="ground truth '' cannot be parsed"):
        math_score.compute_score(r"\boxed{1}", "")
