"""The LLM-judge reward worker on a vLLM server replica that it starts itself (``make test-vllm``):
the embedded SmolLM2-135M-Instruct served by vLLM's OpenAI server, judged greedily through the same
HTTP client as any OpenAI-compatible URL; its verdicts equal the local transformers judge's (greedy,
fp32), every request is answered without a retry, and the server stops with the worker."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(3600)]  # a loaded 2-core machine takes minutes to start vLLM
pytest.importorskip("vllm")

from reward_worker_batch import build_batch  # noqa: E402

from rlvr.reward.config import JudgeServerConfig  # noqa: E402
from rlvr.reward.contract import check_worker_output  # noqa: E402
from rlvr.reward.scorers.judge import LocalJudge  # noqa: E402
from rlvr.reward.workers import LLMJudgeRewardConfig, LLMJudgeRewardWorker  # noqa: E402
from rlvr.utils.model import DEFAULT_MODEL, load_causal_lm, load_tokenizer  # noqa: E402

TEMPLATE = "Is {response} the answer to {question}? The answer is {reference}. Reply yes or no."


def test_judge_on_a_managed_vllm_replica(tokenizer_path, tmp_path):
    config = LLMJudgeRewardConfig(
        tokenizer_path=tokenizer_path, judge_model_path=DEFAULT_MODEL, max_new_tokens=8, max_concurrency=2,
        prompt_template=TEMPLATE, request_timeout_s=300, retry_backoff_s=0.1,
        judge_server=JudgeServerConfig(enable=True, max_model_len=512, log_dir=str(tmp_path), dtype="float32"))
    worker = LLMJudgeRewardWorker(config)
    worker.initialize(None)
    try:
        data = build_batch(["4", "5", "four"], ["4", "4", "4"], prompts=["2+2=", "2+2=", "2+2="])
        out = worker.compute_rewards(data)
        check_worker_output(out, 3, data.batch["responses"].shape[1], "judge")
        assert worker.judge.stats == {"requests": 3, "retries": 0, "failures": 0}
        rewards = out.batch["response_level_rewards"]
        assert bool(((rewards >= 0) & (rewards <= 1)).all())
        prompts = [TEMPLATE.format(question="2+2=", response=r, reference="4") for r in ("4", "5")]
        served = worker.judge.generate(prompts)
        local = LocalJudge(load_causal_lm(DEFAULT_MODEL, dtype=torch.float32), load_tokenizer(DEFAULT_MODEL), 8)
        assert served == local.generate(prompts)  # greedy fp32: the server judges as transformers does
        assert (tmp_path / "judge-server.log").is_file()
    finally:
        worker.server.stop()
    assert worker.server.replica.exited()
