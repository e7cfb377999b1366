"""Domain routing: a mixed batch split by data_source / tag, scored per route, reassembled in order."""

from __future__ import annotations

import pytest
import torch
from reward_batch import make_batch

from rlvr.protocol import DataProto
from rlvr.utils.errors import RewardError
from rlvr.utils.testing import tiny_tokenizer
from rlvr.reward.managers import NaiveRewardManager
from rlvr.reward.router import RewardRouter
from rlvr.reward.contract import check_response_scores, check_token_level_scores


class LengthRewardWorker:
    """A reward worker written from scratch like examples/custom_reward_worker.py: zeros per token,
    the reward per response, float16."""

    def __init__(self, shape_bug: bool = False, placed: bool = False, inconsistent: bool = False) -> None:
        self.calls: list[int] = []
        self.shape_bug, self.placed, self.inconsistent = shape_bug, placed, inconsistent

    def compute_rewards(self, data: DataProto) -> DataProto:
        self.calls.append(len(data))
        lengths = data.batch["response_mask"].sum(dim=-1).to(torch.float16)
        token_level = torch.zeros_like(data.batch["responses"], dtype=torch.float16)
        if self.shape_bug:
            token_level = token_level[:, :-1]
        if self.placed:  # verl style: the reward already sits on the last valid token
            token_level[torch.arange(len(data)), data.batch["response_mask"].sum(dim=-1) - 1] = lengths / 10
        if self.inconsistent:
            token_level[:, 0] = 1.0
        return DataProto.from_dict(
            tensors={"token_level_rewards": token_level, "response_level_rewards": lengths / 10, "scores": lengths},
            meta_info={"metrics": {"reward/code/length": lengths.tolist()}},
        )


def _countdown_scorer(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": 0.5 if solution_str == ground_truth else 0.0, "acc": float(solution_str == ground_truth)}


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def test_mixed_batch_is_routed_and_reassembled_in_order(tok):
    data = make_batch(
        tok,
        ["#### 7", "abc", "5", "#### 8", "abcdefg", "6"],
        ["openai/gsm8k", "code", "countdown", "openai/gsm8k", "code", "countdown"],
        ["7", None, "5", "9", None, "7"],
        response_len=10,
    )
    worker = LengthRewardWorker()
    router = RewardRouter(
        {"openai/gsm8k": NaiveRewardManager(tok, 0), "countdown": _countdown_scorer, "code": worker}, tokenizer=tok
    )
    out = router(data, return_dict=True)
    expected = torch.zeros(6, 10)
    expected[0, 6] = 1.0  # "#### 7" + EOS -> last token 6
    expected[1, 3] = 0.4  # "abc" + EOS: 4 tokens -> 4 / 10
    expected[2, 1] = 0.5
    expected[4, 7] = 0.8
    torch.testing.assert_close(out["reward_tensor"], expected, atol=1e-3, rtol=0)
    assert worker.calls == [2]
    assert out["reward_extra_info"]["acc"] == [None, None, 1.0, None, None, 0.0]  # countdown's scorer gives acc
    assert out["reward_extra_info"]["score"][1] == pytest.approx(4.0)
    metrics = out["reward_metrics"]
    assert metrics["reward/openai/gsm8k/mean_score"] == 0.5
    assert metrics["reward/countdown/mean_score"] == 0.25
    assert metrics["reward/code/mean_score"] == pytest.approx(6.0) and metrics["reward/code/count"] == 2.0
    assert metrics["reward/code/length"] == pytest.approx(6.0)  # the worker's own metrics, averaged
    torch.testing.assert_close(router(data), expected, atol=1e-3, rtol=0)
    placed = RewardRouter({"openai/gsm8k": NaiveRewardManager(tok, 0), "countdown": _countdown_scorer,
                           "code": LengthRewardWorker(placed=True)}, tokenizer=tok)
    torch.testing.assert_close(placed(data), expected, atol=1e-3, rtol=0)  # not counted twice


def test_route_by_tag(tok):
    data = make_batch(tok, ["#### 1", "#### 1"], ["openai/gsm8k", "openai/gsm8k"], ["1", "1"], tag=["rl", "eval"])
    router = RewardRouter({"rl": NaiveRewardManager(tok, 0), "eval": lambda *a, **k: 0.0}, key="tag", tokenizer=tok)
    assert router(data).sum(dim=-1).tolist() == [1.0, 0.0]


def test_unknown_domain_names_it_and_the_known_ones(tok):
    data = make_batch(tok, ["a", "b"], ["math", "poetry"], ["a", "b"])
    router = RewardRouter({"math": _countdown_scorer}, tokenizer=tok)
    with pytest.raises(RewardError, match=r"no reward route for data_source 'poetry'; known data_source values: math"):
        router(data)
    with pytest.raises(RewardError, match="lacks"):
        RewardRouter({"x": _countdown_scorer}, key="tag", tokenizer=tok)(data)


def test_worker_contract_violations_name_the_route(tok):
    data = make_batch(tok, ["abc"], ["code"], [None])
    with pytest.raises(RewardError, match=r"route 'code' \(LengthRewardWorker.compute_rewards\) produced token_level_rewards of shape"):
        RewardRouter({"code": LengthRewardWorker(shape_bug=True)})(data)
    with pytest.raises(RewardError, match=r"summing to 1.0000 for sample 0 but response_level_rewards 0.(3999|4000)"):
        RewardRouter({"code": LengthRewardWorker(inconsistent=True)})(data)
    with pytest.raises(RewardError, match="give RewardRouter a tokenizer"):
        RewardRouter({"code": _countdown_scorer})


def test_contract_checks():
    check_token_level_scores(torch.zeros(2, 3), 2, 3, "src")
    with pytest.raises(RewardError, match=r"src produced token_level_scores of shape \[2, 4\]; expected \[batch, response_len\] = \[2, 3\]"):
        check_token_level_scores(torch.zeros(2, 4), 2, 3, "src")
    with pytest.raises(RewardError, match="dtype torch.int64"):
        check_response_scores(torch.zeros(2, dtype=torch.long), 2, "src")
    with pytest.raises(RewardError, match=r"non-finite scores value inf at index \[1\]"):
        check_response_scores(torch.tensor([0.0, float("inf")]), 2, "src")


def test_routes_to_a_real_reward_worker_group(tok, tmp_path):
    from rlvr.single_controller import ClassWithInitArgs, get_resource_pool_cls, get_worker_group_cls
    from rlvr.reward.workers import MathRuleRewardConfig, MathRuleRewardWorker

    tok.save_pretrained(tmp_path)
    pool = get_resource_pool_cls("local")(process_on_nodes=[1], use_gpu=False)
    group = get_worker_group_cls("local")(
        pool, ClassWithInitArgs(MathRuleRewardWorker, MathRuleRewardConfig(tokenizer_path=str(tmp_path))),
        name_prefix="router_math", call_timeout_s=60,
    )
    try:
        group.initialize(None)
        data = make_batch(
            tok, [r"\boxed{0.5}", "#### 3", r"\boxed{2}", "#### 4"], ["math", "gsm8k", "math", "gsm8k"],
            [r"\frac{1}{2}", "3", "3", "3"], response_len=16,
        )
        out = RewardRouter({"math": group, "gsm8k": NaiveRewardManager(tok, 0)})(data, return_dict=True)
    finally:
        group.shutdown()
        pool.remove()
    expected = torch.zeros(4, 16)
    expected[0, 11] = 1.0  # "\boxed{0.5}" = 11 chars + EOS
    expected[1, 6] = 1.0  # "#### 3" = 6 chars + EOS
    torch.testing.assert_close(out["reward_tensor"], expected)
    assert out["reward_metrics"]["reward/math/mean_score"] == 0.5
    assert out["reward_metrics"]["reward/gsm8k/mean_score"] == 0.5
