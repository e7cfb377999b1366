"""A slow scorer under ``compute_score_timeout``: as in verl's naive manager, a sample that runs past
the limit scores 0, is logged, and scoring goes on; rlvr counts it in ``reward/<source>/timeouts``.
``reward_model.on_error=raise`` stops the run at the first timeout instead; a scorer that raises
anything else than a ``TimeoutError`` is not a timeout and raises (verl catches only ``TimeoutError``)."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from rlvr.protocol import DataProto
from rlvr.reward.scorers import ScorerTimeoutError
from rlvr.trainer.ppo.reward import compute_reward, load_reward_manager
from rlvr.utils.errors import RewardError
from rlvr.workers.reward_manager import BatchRewardManager, DAPORewardManager, NaiveRewardManager
from rlvr.workers.reward_manager.naive import _score_timeout


class LetterTokenizer:
    """Token ``i`` decodes to one letter (only ``decode``, as verl's stub tokenizers)."""

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join(chr(ord("a") + int(i) % 26) for i in ids)


def _batch(valid: list[int], sources: list[str]) -> DataProto:
    """Responses of 4 columns with ``valid[i]`` valid tokens each; prompts of 2 tokens."""
    n = len(valid)
    response_mask = torch.tensor([[1] * v + [0] * (4 - v) for v in valid])
    return DataProto.from_single_dict({
        "prompts": torch.ones(n, 2, dtype=torch.long),
        "responses": torch.arange(4).repeat(n, 1),
        "attention_mask": torch.cat([torch.ones(n, 2, dtype=torch.long), response_mask], dim=1),
        "reward_model": np.array([{"ground_truth": "x"}] * n, dtype=object),
        "data_source": np.array(sources, dtype=object),
    })


def _last_token_rewards(tensor: torch.Tensor, valid: list[int]) -> list[float]:
    return [tensor[i, v - 1].item() for i, v in enumerate(valid)]


SLOW_SCORER = '''
import time

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if len(solution_str) == 1:
        time.sleep(60)
    return float(len(solution_str))
'''


def test_a_timed_out_sample_scores_zero_is_logged_and_counted_by_default(caplog):
    def slow_on_one_token(data_source, solution_str, ground_truth, extra_info=None):  # local: scored under SIGALRM
        if len(solution_str) == 1:
            time.sleep(5)
        return float(len(solution_str))

    valid, sources = [3, 1, 2, 1], ["a", "a", "b", "b"]
    manager = NaiveRewardManager(LetterTokenizer(), 0, slow_on_one_token, compute_score_timeout=0.3)
    assert manager.on_error == "fallback_timeouts" and manager.pool is None
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="rlvr.reward.managers.base"):
        out = manager(_batch(valid, sources), return_dict=True)
    assert time.monotonic() - start < 4.0  # two 5 s sleeps were cut at 0.3 s each
    assert _last_token_rewards(out["reward_tensor"], valid) == [3.0, 0.0, 2.0, 0.0]
    metrics = out["reward_metrics"]
    assert (metrics["reward/a/timeouts"], metrics["reward/b/timeouts"], metrics["reward/a/errors"]) == (1.0, 1.0, 0.0)
    assert (metrics["reward/a/mean_score"], metrics["reward/b/mean_score"]) == (1.5, 1.0)  # the 0s count in the mean
    [record] = caplog.records
    assert "1 timed out (data_source 'a'), 1 timed out (data_source 'b')" in record.getMessage()


def test_on_error_raise_stops_at_the_first_timeout():
    def slow(data_source, solution_str, ground_truth, extra_info=None):
        time.sleep(5)
        return 1.0

    manager = NaiveRewardManager(LetterTokenizer(), 0, slow, compute_score_timeout=0.2, on_error="raise")
    with pytest.raises(RewardError, match=r"scoring sample 0 \(data_source 'a'\) timed out: compute_score ran "
                       r"past compute_score_timeout=0.2 s\. Set reward_model.on_error=fallback_timeouts"):
        manager(_batch([2], ["a"]))


def test_a_scorer_that_raises_is_not_a_timeout_and_raises():
    def broken(data_source, solution_str, ground_truth, extra_info=None):
        raise ValueError("bad ground truth")

    manager = NaiveRewardManager(LetterTokenizer(), 0, broken, compute_score_timeout=1.0)
    with pytest.raises(ValueError, match="bad ground truth"):
        manager(_batch([2], ["a"]))


def test_the_scorers_own_timeout_error_counts_as_a_timeout():
    def gives_up(data_source, solution_str, ground_truth, extra_info=None):
        if len(solution_str) == 1:
            raise TimeoutError("the sandbox did not answer")
        return 1.0

    valid = [1, 2]
    out = NaiveRewardManager(LetterTokenizer(), 0, gives_up, fallback_score=-0.5)(_batch(valid, ["a", "a"]),
                                                                                  return_dict=True)
    assert _last_token_rewards(out["reward_tensor"], valid) == [-0.5, 1.0]
    assert (out["reward_metrics"]["reward/a/timeouts"], out["reward_metrics"]["reward/a/errors"]) == (1.0, 0.0)


def test_a_verl_config_through_the_naive_manager_gets_verls_behaviour(tmp_path):
    """verl's keys only, the scorer from a file (picklable: scored in a helper process killed at the
    limit); the count reaches the step's metrics through ``compute_reward``."""
    path = tmp_path / "slow_scorer.py"
    path.write_text(SLOW_SCORER)
    config = OmegaConf.create({
        "reward_model": {"reward_manager": "naive", "reward_kwargs": {"compute_score_timeout": 1.0}},
        "custom_reward_function": {"path": str(path), "name": "compute_score"},
    })
    valid = [2, 1, 3]
    with load_reward_manager(config, LetterTokenizer(), num_examine=0) as manager:
        assert manager.on_error == "fallback_timeouts" and manager.pool is not None
        data = _batch(valid, ["s"] * 3)
        scores, _ = compute_reward(data, manager)
    assert _last_token_rewards(scores, valid) == [2.0, 0.0, 3.0]
    assert data.meta_info["metrics"]["reward/s/timeouts"] == 1.0
    config.reward_model.on_error = "raise"  # rlvr's choice, kept
    with load_reward_manager(config, LetterTokenizer(), num_examine=0) as manager:
        assert manager.on_error == "raise"
        with pytest.raises(RewardError, match=r"scoring sample 1 \(data_source 's'\) timed out"):
            manager(_batch(valid, ["s"] * 3))


def test_dapo_extends_the_naive_default_and_the_others_keep_raise():
    assert DAPORewardManager(LetterTokenizer(), 0).on_error == "fallback_timeouts"
    assert BatchRewardManager(LetterTokenizer(), 0).on_error == "raise"


def test_a_batch_scorer_under_fallback_timeouts():
    def times_out(data_sources, solution_strs, ground_truths, extra_infos):
        raise ScorerTimeoutError("the judge did not answer")

    def breaks(data_sources, solution_strs, ground_truths, extra_infos):
        raise KeyError("judge_url")

    valid = [2, 1]
    out = BatchRewardManager(LetterTokenizer(), 0, times_out, on_error="fallback_timeouts", fallback_score=-1.0)(
        _batch(valid, ["a", "a"]), return_dict=True)
    assert _last_token_rewards(out["reward_tensor"], valid) == [-1.0, -1.0]
    assert out["reward_metrics"]["reward/a/timeouts"] == 2.0
    with pytest.raises(KeyError, match="judge_url"):
        BatchRewardManager(LetterTokenizer(), 0, breaks, on_error="fallback_timeouts")(_batch(valid, ["a", "a"]))
    with pytest.raises(ScorerTimeoutError):
        BatchRewardManager(LetterTokenizer(), 0, times_out)(_batch(valid, ["a", "a"]))


def test_verls_score_timeout_context():
    with _score_timeout(None), _score_timeout(0):  # no limit
        time.sleep(0.05)
    with _score_timeout(5.0):
        assert sum(range(10)) == 45
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="compute_score_timeout=0.2 s"):
        with _score_timeout(0.2):
            time.sleep(3)
    assert time.monotonic() - start < 1.5
