"""LLM judge: score parser, prompt template, HTTP back-end against a local stub, local tiny model."""

from concurrent.futures import ThreadPoolExecutor

import pytest

from rlvr.utils.errors import RewardError
from rlvr.reward.scorers.judge import HttpJudge, LocalJudge, format_judge_prompt, parse_judge_score
from rlvr.utils.testing import StubReply, judge_stub_server, openai_stub_server, tiny_causal_lm


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
    judge = HttpJudge("http://127.0.0.1:9/v1", "m", timeout_s=1, max_retries=1, retry_backoff_s=0.01)
    with pytest.raises(RewardError, match=r"judge endpoint .* failed 2 time\(s\), the last: .*Connection refused"):
        judge.generate(["x"])
    assert judge.stats == {"requests": 1, "retries": 1, "failures": 1}


def test_http_judge_retries_server_errors_and_time_outs_then_answers():
    def answer(body, number):  # request 0: 500, request 1: too slow, request 2: 429, then answers
        return {0: StubReply(status=500), 1: StubReply("late", delay_s=1.0), 2: StubReply(status=429)}.get(
            number, StubReply("Score: 7/10"))

    with openai_stub_server(answer) as (url, log):
        judge = HttpJudge(url, "m", timeout_s=0.3, max_retries=3, retry_backoff_s=0.01)
        assert judge.generate(["q"]) == ["Score: 7/10"]
    assert len(log.requests) == 4 and judge.stats == {"requests": 1, "retries": 3, "failures": 0}


def test_http_judge_gives_up_after_its_retries_on_time_outs():
    with openai_stub_server(lambda body, number: StubReply("slow", delay_s=1.0)) as (url, log):
        judge = HttpJudge(url, "m", timeout_s=0.2, max_retries=2, retry_backoff_s=0.01)
        with pytest.raises(RewardError, match=r"failed 3 time\(s\), the last: no answer within 0.2 s"):
            judge.generate(["q"])
    assert len(log.requests) == 3


def test_http_judge_does_not_retry_a_refused_request():
    with openai_stub_server(lambda body, number: StubReply(status=401)) as (url, log):
        judge = HttpJudge(url, "m", timeout_s=2, max_retries=3, retry_backoff_s=0.01)
        with pytest.raises(RewardError, match=r"refused the request \(HTTP 401.*check the model name and the API key"):
            judge.generate(["q"])
    assert len(log.requests) == 1


def test_http_judge_keeps_at_most_its_cap_in_flight_over_concurrent_calls():
    with openai_stub_server(lambda body, number: StubReply("[[5]]", delay_s=0.05)) as (url, log):
        judge = HttpJudge(url, "m", timeout_s=5, max_concurrency=3)
        with ThreadPoolExecutor(4) as callers:  # four callers at once share the judge's cap
            replies = list(callers.map(judge.generate, [[f"q{i}-{j}" for j in range(6)] for i in range(4)]))
    assert [len(r) for r in replies] == [6, 6, 6, 6] and len(log.requests) == 24
    assert log.max_in_flight == 3


def test_local_judge_generates_with_a_tiny_model():
    model, tokenizer = tiny_causal_lm()
    side = tokenizer.padding_side
    judge = LocalJudge(model, tokenizer, max_new_tokens=5, batch_size=2)
    replies = judge.generate(["short", "a much longer prompt here", "third"])
    assert len(replies) == 3 and all(isinstance(r, str) for r in replies)
    assert replies[0] == judge.generate(["short"])[0]  # greedy and left padding: batch-independent
    assert tokenizer.padding_side == side  # restored after generation
