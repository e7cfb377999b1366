"""LLMJudgeRewardWorker with a local tiny random model and with an OpenAI-compatible stub server."""

import numpy as np
import pytest
from reward_worker_batch import build_batch

from rlvr.utils.errors import RewardError
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
    worker = LLMJudgeRewardWorker(LLMJudgeRewardConfig(tokenizer_path=tokenizer_path, judge_api_base="http://127.0.0.1:9/v1", request_timeout_s=1))
    worker.initialize(None)
    with pytest.raises(RewardError, match="judge endpoint"):
        worker.compute_rewards(build_batch(["4"], ["4"]))
