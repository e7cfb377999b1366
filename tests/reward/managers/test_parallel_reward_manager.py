"""Parallel reward manager: process-pool scoring with hard per-sample time limits."""

from __future__ import annotations

import time

import pytest
from reward_batch import make_batch

from rlvr.utils.errors import RewardError
from rlvr.reward.scorers.custom import CustomRewardFunction
from rlvr.utils.testing import tiny_tokenizer
from rlvr.reward.managers import ParallelRewardManager

SCORER_FILE = '''
import os, time

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "sleep":
        time.sleep(600)
    if solution_str == "raise":
        raise ValueError("bad sample")
    if solution_str == "crash":
        os._exit(7)
    return float(solution_str == ground_truth)
'''


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture()
def scorer(tmp_path):
    path = tmp_path / "hostile_scorer.py"
    path.write_text(SCORER_FILE)
    return CustomRewardFunction(path=str(path), name="compute_score")


def test_sleeping_raising_and_crashing_samples_get_the_fallback(tok, scorer):
    data = make_batch(tok, ["a", "sleep", "raise", "crash", "b"], ["s"] * 4 + ["t"], ["a", "x", "x", "x", "b"])
    manager = ParallelRewardManager(tok, 0, scorer, num_workers=2, timeout_s=1.0, on_error="fallback", fallback_score=-1.0)
    try:
        start = time.monotonic()
        out = manager(data, return_dict=True)
        assert time.monotonic() - start < 120.0  # the sleeping sample would take 600 s (room for a loaded machine)
        assert out["reward_tensor"].sum(dim=-1).tolist() == [1.0, -1.0, -1.0, -1.0, 1.0]
        metrics = out["reward_metrics"]
        assert (metrics["reward/s/timeouts"], metrics["reward/s/errors"], metrics["reward/s/count"]) == (1.0, 2.0, 4.0)
        assert metrics["reward/t/mean_score"] == 1.0
        again = manager(make_batch(tok, ["a", "b"], ["s", "s"], ["a", "a"]))  # replaced workers still serve
        assert again.sum(dim=-1).tolist() == [1.0, 0.0]
    finally:
        manager.close()


def test_timeout_under_raise_names_sample_and_source(tok, scorer):
    data = make_batch(tok, ["a", "sleep"], ["s", "slow_source"], ["a", "a"])
    with ParallelRewardManager(tok, 0, scorer, num_workers=1, timeout_s=1.0) as manager:
        with pytest.raises(RewardError, match=r"sample 1 \(data_source 'slow_source'\) timed out"):
            manager(data)


def test_default_scorer_and_unknown_source(tok):
    with ParallelRewardManager(tok, 0, num_workers=2, timeout_s=30.0, on_error="fallback") as manager:
        data = make_batch(tok, ["#### 3", "#### 4", r"\boxed{0.5}"], ["openai/gsm8k", "gsm8k", "math"], ["3", "3", r"\frac12"])
        assert manager(data).sum(dim=-1).tolist() == [1.0, 0.0, 1.0]
        with pytest.raises(RewardError, match="no reward scorer is registered for data_source 'nowhere'"):
            manager(make_batch(tok, ["x"], ["nowhere"], ["y"]))


def test_unpicklable_scorer_fails_at_construction(tok):
    with pytest.raises(RewardError, match="compute_score must be picklable"):
        ParallelRewardManager(tok, 0, compute_score=lambda **_: 1.0)
