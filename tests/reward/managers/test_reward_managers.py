"""Naive, DAPO and batch reward managers: placement, metrics, error policy, overlong penalty."""

from __future__ import annotations


import pytest
import torch
from reward_batch import make_batch

from rlvr.utils.errors import ConfigError, RewardError
from rlvr.reward.scorers import UnknownDataSourceError
from rlvr.utils.testing import tiny_tokenizer
from rlvr.reward.managers import (
    BatchRewardManager,
    DAPORewardManager,
    NaiveRewardManager,
    get_reward_manager_cls,
)
from rlvr.reward.decode import last_valid_index


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def test_score_lands_on_last_valid_token(tok):
    # byte-level tokenizer: one token per character, plus EOS
    data = make_batch(tok, ["#### 72", "#### 5", "x #### 1000"], ["openai/gsm8k"] * 3, ["72", "6", "1000"], response_len=16)
    out = NaiveRewardManager(tok, num_examine=0)(data, return_dict=True)
    expected = torch.zeros(3, 16)
    expected[0, 7] = 1.0  # 7 chars -> tokens 0..6, EOS at 7
    expected[2, 11] = 1.0
    torch.testing.assert_close(out["reward_tensor"], expected)
    assert out["reward_extra_info"] == {}  # the GSM8K scorer returns a plain float, as verl's does
    metrics = out["reward_metrics"]
    assert metrics["reward/openai/gsm8k/count"] == 3.0
    assert metrics["reward/openai/gsm8k/mean_score"] == pytest.approx(2 / 3)
    assert "reward/openai/gsm8k/acc" not in metrics
    assert metrics["reward/openai/gsm8k/errors"] == 0.0
    plain = NaiveRewardManager(tok, num_examine=0)(data)
    torch.testing.assert_close(plain, expected)


def test_last_valid_index_with_gaps_and_empty_rows():
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]])
    assert last_valid_index(mask).tolist() == [1, 2, 0, 3]


def _scorer(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "none":
        return None
    if solution_str == "boom":
        raise ValueError("scorer exploded")
    return {"score": float(solution_str == ground_truth), "acc": float(solution_str == ground_truth), "len": len(solution_str)}


def test_not_applicable_and_per_source_metrics(tok):
    data = make_batch(tok, ["a", "none", "b", "b"], ["s1", "s1", "s2", "s2"], ["a", "a", "b", "c"])
    out = NaiveRewardManager(tok, 0, compute_score=_scorer)(data, return_dict=True)
    assert out["reward_tensor"].sum(dim=-1).tolist() == [1.0, 0.0, 1.0, 0.0]
    m = out["reward_metrics"]
    assert (m["reward/s1/count"], m["reward/s1/not_applicable"], m["reward/s1/mean_score"]) == (2.0, 1.0, 1.0)
    assert (m["reward/s2/count"], m["reward/s2/mean_score"], m["reward/s2/acc"]) == (2.0, 0.5, 0.5)
    assert out["reward_extra_info"]["len"] == [1, None, 1, 1]


def test_raising_scorer_raise_and_fallback(tok):
    data = make_batch(tok, ["a", "boom"], ["s1", "s2"], ["a", "a"])
    with pytest.raises(ValueError, match="scorer exploded") as raised:  # the scorer's own exception type
        NaiveRewardManager(tok, 0, compute_score=_scorer)(data)
    assert "scoring sample 1 (data_source 's2') failed" in raised.value.__notes__[0]
    out = NaiveRewardManager(tok, 0, compute_score=_scorer, on_error="fallback", fallback_score=-0.5)(data, return_dict=True)
    assert out["reward_tensor"].sum(dim=-1).tolist() == [1.0, -0.5]
    assert out["reward_metrics"]["reward/s2/errors"] == 1.0
    assert out["reward_metrics"]["reward/s2/mean_score"] == -0.5
    with pytest.raises(ConfigError, match="on_error"):
        NaiveRewardManager(tok, 0, on_error="ignore")


def test_unknown_data_source_is_never_a_fallback(tok):
    data = make_batch(tok, ["#### 1"], ["no_such_source"], ["1"])
    with pytest.raises(UnknownDataSourceError, match="no_such_source"):
        NaiveRewardManager(tok, 0, on_error="fallback")(data)


@pytest.mark.parametrize(
    "bad,match",
    [(float("nan"), "non-finite"), ({"acc": 1.0}, "without 'score'"), ("1.0", "returned str")],
)
def test_malformed_scores_break_the_contract(tok, bad, match):
    data = make_batch(tok, ["a"], ["s1"], ["a"])
    with pytest.raises(RewardError, match=match):
        NaiveRewardManager(tok, 0, compute_score=lambda **_: bad, on_error="fallback")(data)


def test_dapo_overlong_penalty_hand_computed(tok):
    # max_resp_len 10, buffer 4 -> penalty starts after 6 tokens: -(L - 6) / 4 * 0.5
    responses = ["1234", "12345678", "123456789"]  # + EOS: L = 5, 9, 10
    data = make_batch(tok, responses, ["s"] * 3, ["1234", "x", "123456789"], response_len=10)
    cfg = {"enable": True, "len": 4, "penalty_factor": 0.5, "log": True}
    manager = DAPORewardManager(tok, 0, compute_score=_scorer, max_resp_len=10, overlong_buffer_cfg=cfg)
    out = manager(data, return_dict=True)
    penalties = [0.0, -(9 - 6) / 4 * 0.5, -(10 - 6) / 4 * 0.5]
    assert out["reward_extra_info"]["overlong_reward"] == pytest.approx(penalties)
    assert out["reward_extra_info"]["overlong"] == [False, True, True]
    assert out["reward_tensor"][0, 4].item() == pytest.approx(1.0)
    assert out["reward_tensor"][1, 8].item() == pytest.approx(-0.375)
    assert out["reward_tensor"][2, 9].item() == pytest.approx(1.0 - 0.5)
    assert out["reward_metrics"]["reward/overlong/mean_penalty"] == pytest.approx(sum(penalties) / 3)
    assert out["reward_metrics"]["reward/overlong/frac"] == pytest.approx(2 / 3)
    disabled = DAPORewardManager(tok, 0, compute_score=_scorer, max_resp_len=10)(data)
    assert disabled.sum(dim=-1).tolist() == [1.0, 0.0, 1.0]


def test_dapo_config_errors(tok):
    with pytest.raises(ConfigError, match="max_resp_len"):
        DAPORewardManager(tok, 0, overlong_buffer_cfg={"enable": True, "len": 4})
    with pytest.raises(ConfigError, match="overlong_buffer.len"):
        DAPORewardManager(tok, 0, max_resp_len=8, overlong_buffer_cfg={"enable": True, "len": 0})


def test_batch_manager_calls_scorer_once_with_lists(tok):
    calls = []

    def batch_scorer(data_sources, solution_strs, ground_truths, extra_infos, bonus):
        calls.append(list(solution_strs))
        return [float(s == g) + bonus for s, g in zip(solution_strs, ground_truths)]

    data = make_batch(tok, ["a", "b", "c"], ["s"] * 3, ["a", "x", "c"])
    out = BatchRewardManager(tok, 0, compute_score=batch_scorer, bonus=0.5)(data, return_dict=True)
    assert calls == [["a", "b", "c"]]
    assert out["reward_tensor"].sum(dim=-1).tolist() == [1.5, 0.5, 1.5]
    default = BatchRewardManager(tok, 0)(make_batch(tok, ["#### 3", "#### 4"], ["gsm8k"] * 2, ["3", "3"]))
    assert default.sum(dim=-1).tolist() == [1.0, 0.0]


def test_batch_manager_failures(tok):
    data = make_batch(tok, ["a", "b"], ["s", "t"], ["a", "b"])
    with pytest.raises(RewardError, match="returned 1 scores for a batch of 2"):
        BatchRewardManager(tok, 0, compute_score=lambda **_: [1.0])(data)

    def broken(**_):
        raise RuntimeError("service down")

    with pytest.raises(RuntimeError, match="service down") as raised:
        BatchRewardManager(tok, 0, compute_score=broken)(data)
    assert "batch of 2 samples, data sources ['s', 't']" in raised.value.__notes__[0]
    out = BatchRewardManager(tok, 0, compute_score=broken, on_error="fallback")(data, return_dict=True)
    assert out["reward_metrics"]["reward/s/errors"] == 1.0 and out["reward_metrics"]["reward/t/errors"] == 1.0


def test_registry_lookup():
    assert get_reward_manager_cls("dapo") is DAPORewardManager
    with pytest.raises(KeyError, match="batch, dapo, naive, parallel"):
        get_reward_manager_cls("prime")


def test_num_examine_prints_per_source(tok, capsys):
    data = make_batch(tok, ["#### 1", "#### 2", "#### 3"], ["gsm8k", "gsm8k", "openai/gsm8k"], ["1", "2", "3"])
    NaiveRewardManager(tok, num_examine=1)(data)
    printed = capsys.readouterr().out
    assert printed.count("[response]") == 2 and "[gsm8k] sample 0" in printed and "[openai/gsm8k] sample 2" in printed
