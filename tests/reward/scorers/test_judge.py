"""LLM judge: score parser, prompt template, HTTP back-end against a local stub, local tiny model."""

import pytest

from rlvr.utils.errors import RewardError
from rlvr.reward.scorers.judge import HttpJudge, LocalJudge, format_judge_prompt, parse_judge_score
from rlvr.utils.testing import judge_stub_server, tiny_causal_lm


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The answer is mostly right. Score: 7/10", 0.7),
        ("Final verdict: [[8]]", 0.8),
        ("rating: 0.7", 0.7),
        ('{"score": 3}', 0.3),
        ('Reasoning... {"rating": "4 out of 5"}', 0.8),
        ("Grade = 9 out of 10", 0.9),
        ("score: 85%", 0.85),
        ("I'd give it 3/4.", 0.75),
        ("Score: 1.0", 1.0),
        ("Score: 1", 0.1),
        ("Yes", 1.0),
        ("The candidate is incorrect.", 0.0),
        ("At first it looked wrong, but it is correct.", 1.0),
        ("not correct", 0.0),
        ("Score: 12/10", None),
        ("Score: -3", None),
        ("I cannot judge this.", None),
        ("", None),
    ],
)
def test_parse_judge_score(text, expected):
    assert parse_judge_score(text) == (None if expected is None else pytest.approx(expected))


def test_parse_judge_score_custom_scale():
    assert parse_judge_score("[[4]]", scale_max=5) == pytest.approx(0.8)


def test_format_judge_prompt():
    assert format_judge_prompt("Q={question} R={response} A={reference}", "1+1", "2", "2") == "Q=1+1 R=2 A=2"
    with pytest.raises(RewardError, match="unknown placeholder"):
        format_judge_prompt("{answer}", "q", "r", "a")


def test_http_judge_against_a_local_stub(monkeypatch):
    monkeypatch.setenv("JUDGE_KEY", "secret")
    with judge_stub_server(lambda prompt: "Score: 9/10" if "GOOD" in prompt else "Score: 2/10") as (url, requests):
        judge = HttpJudge(url, "judge-model", api_key_env="JUDGE_KEY", timeout_s=5)
        replies = judge.generate(["a GOOD answer", "a bad answer"])
    assert [parse_judge_score(r) for r in replies] == [pytest.approx(0.9), pytest.approx(0.2)]
    path, auth, body = requests[0]
    assert path == "/v1/chat/completions" and auth == "Bearer secret" and body["model"] == "judge-model"


def test_http_judge_unreachable_is_a_clear_error():
    judge = HttpJudge("http://127.0.0.1:9/v1", "m", timeout_s=1)
    with pytest.raises(RewardError, match="judge endpoint .* failed"):
        judge.generate(["x"])


def test_local_judge_generates_with_a_tiny_model():
    model, tokenizer = tiny_causal_lm()
    side = tokenizer.padding_side
    judge = LocalJudge(model, tokenizer, max_new_tokens=5, batch_size=2)
    replies = judge.generate(["short", "a much longer prompt here", "third"])
    assert len(replies) == 3 and all(isinstance(r, str) for r in replies)
    assert replies[0] == judge.generate(["short"])[0]  # greedy and left padding: batch-independent
    assert tokenizer.padding_side == side  # restored after generation
