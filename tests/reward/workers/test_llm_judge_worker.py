"""LLMJudgeRewardWorker with a local tiny random model and with an OpenAI-compatible stub server."""

import numpy as np
import pytest
from reward_worker_batch import build_batch

from rlvr.utils.errors import ConfigError, RewardError
from rlvr.utils.testing import judge_stub_server, save_tiny_model
from rlvr.reward.workers import LLMJudgeRewardConfig, LLMJudgeRewardWorker
from rlvr.reward.contract import check_worker_output


def _judge_reply(prompt: str) -> str:
    """Stub judge: [[9]] when the candidate answer is the reference, 'hmm' for 'unsure', else verdict no."""
    candidate = prompt.split("Candidate answer:\n", 1)[1].split("\n\n", 1)[0]
    reference = prompt.split("Reference answer:\n", 1)[1].split("\n\n", 1)[0]
    return "[[9]]" if candidate.strip() == reference.strip() else ("hmm" if "unsure" in candidate else "Verdict: no")


@pytest.fixture
def judge_url():
    with judge_stub_server(_judge_reply) as (url, _):
        yield url


def test_http_judge_scores_and_fallback(tokenizer_path, judge_url):
    data = build_batch(["<think>2+2</think>4", "5", "unsure"], ["4", "4", "4"])
    data.non_tensor_batch["raw_prompt"] = np.array(
        [[{"role": "system", "content": "s"}, {"role": "user", "content": "2+2?"}]] * 3 + [None], dtype=object)[:-1]
    worker = LLMJudgeRewardWorker(LLMJudgeRewardConfig(tokenizer_path=tokenizer_path, judge_api_base=judge_url, request_timeout_s=10))
    worker.initialize(None)
    out = worker.compute_rewards(data)
    check_worker_output(out, 3, data.batch["responses"].shape[1], "judge")
    assert out.batch["response_level_rewards"].tolist() == pytest.approx([0.9, 0.0, 0.0])
    assert out.meta_info["metrics"]["reward/llm_judge/not_applicable"] == [0.0, 0.0, 1.0]
    fallback = LLMJudgeRewardWorker(LLMJudgeRewardConfig(tokenizer_path=tokenizer_path, judge_api_base=judge_url, fallback_score=0.5))
    fallback.initialize(None)
    out = fallback.compute_rewards(data)
    assert out.batch["response_level_rewards"].tolist() == pytest.approx([0.9, 0.0, 0.5])
    assert out.meta_info["metrics"]["reward/llm_judge/not_applicable"] == [0.0, 0.0, 0.0]


def test_local_tiny_judge_model(tokenizer_path, tmp_path):
    model_dir = save_tiny_model(tmp_path / "judge")
    config = LLMJudgeRewardConfig(tokenizer_path=tokenizer_path, judge_model_path=str(model_dir), max_new_tokens=4,
                                  prompt_template="Q: {question} A: {response} Ref: {reference}. Score:")
    worker = LLMJudgeRewardWorker(config)
    worker.initialize(None)
    data = build_batch(["4", "five"], ["4", "4"])
    out = worker.compute_rewards(data)
    check_worker_output(out, 2, data.batch["responses"].shape[1], "judge")
    rewards = out.batch["response_level_rewards"].tolist()
    assert all(0.0 <= r <= 1.0 for r in rewards)
    assert out.batch["response_level_rewards"].tolist() == worker.compute_rewards(data).batch["response_level_rewards"].tolist()


def test_unreachable_judge_endpoint(tokenizer_path):
    worker = LLMJudgeRewardWorker(LLMJudgeRewardConfig(tokenizer_path=tokenizer_path, judge_api_base="http://127.0.0.1:9/v1",
                                                       request_timeout_s=1, max_retries=1, retry_backoff_s=0.01))
    worker.initialize(None)
    with pytest.raises(RewardError, match="judge endpoint"):
        worker.compute_rewards(build_batch(["4"], ["4"]))


JUDGE_PLUGINS = """
def prompt(question, response, reference):
    return f"Q={question}|A={response}|R={reference}"

def parse(text, scale_max):
    return 1.0 if text == "RIGHT" else (None if text == "?" else 0.0)

def bad_parse(text, scale_max):
    return 3.0
"""


def test_your_own_prompt_and_parser(tokenizer_path, tmp_path):
    plugins = tmp_path / "judge_plugins.py"
    plugins.write_text(JUDGE_PLUGINS)
    reply = lambda prompt: "RIGHT" if prompt.startswith("Q=") and "|A=4|R=4" in prompt else ("?" if "|A=x|" in prompt else "no")
    data = build_batch(["4", "5", "x"], ["4", "4", "4"])
    with judge_stub_server(reply) as (url, requests):
        config = LLMJudgeRewardConfig(tokenizer_path=tokenizer_path, judge_api_base=url, prompt_fn=f"{plugins}:prompt",
                                      score_parser=f"{plugins}:parse")
        worker = LLMJudgeRewardWorker(config)
        worker.initialize(None)
        out = worker.compute_rewards(data)
        assert out.batch["response_level_rewards"].tolist() == [1.0, 0.0, 0.0]
        assert out.meta_info["metrics"]["reward/llm_judge/not_applicable"] == [0.0, 0.0, 1.0]
        assert requests[0][2]["messages"][0]["content"].startswith("Q=")
        bad = LLMJudgeRewardWorker(LLMJudgeRewardConfig(tokenizer_path=tokenizer_path, judge_api_base=url,
                                                        score_parser=f"{plugins}:bad_parse"))
        bad.initialize(None)
        with pytest.raises(RewardError, match="score parser returned 3.0"):
            bad.compute_rewards(data)
    with pytest.raises(ConfigError, match="reward.workers.llm_judge.score_parser.*no_such"):
        LLMJudgeRewardWorker(LLMJudgeRewardConfig(tokenizer_path=tokenizer_path, score_parser=f"{plugins}:no_such"))
