"""``LLMJudgeRewardWorker``: another LLM grades the response (Zheng et al., 2023, arXiv:2306.05685)."""

from __future__ import annotations

from typing import Any

from rlvr.protocol import DataProto
from rlvr.reward.config import LLMJudgeRewardConfig
from rlvr.reward.decode import decode_prompts
from rlvr.reward.scorers.judge import HttpJudge, LocalJudge, format_judge_prompt, parse_judge_score
from rlvr.reward.workers.base import RuleRewardWorker, ScoredBatch, split_think
from rlvr.reward.workers.registry import register_reward_worker
from rlvr.single_controller.base.decorator import Dispatch, register
from rlvr.utils.errors import RewardError
from rlvr.utils.model import load_causal_lm, load_tokenizer


@register_reward_worker("llm_judge", LLMJudgeRewardConfig)
class LLMJudgeRewardWorker(RuleRewardWorker):
    """Reward = the judge's score in [0, 1] for (question, response, reference).

    The question is the last user message of ``non_tensor_batch["raw_prompt"]`` when present, else
    the decoded prompt; the reference is the ground truth; the response is its answer part (after
    ``</think>``). The judge is a local transformers model (default) or an OpenAI-compatible endpoint.
    A verdict that :func:`parse_judge_score` cannot read gets ``fallback_score``, or 0.0 and counts as
    not applicable when that is None. Metrics: ``reward/llm_judge/{parsed,not_applicable}``.
    """

    metric_prefix = "llm_judge"

    def __init__(self, worker_config: LLMJudgeRewardConfig) -> None:
        super().__init__(worker_config)
        self.judge: LocalJudge | HttpJudge | None = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def initialize(self, pipeline_config: Any = None) -> None:
        """Load the local judge model on this worker's device, or set up the HTTP client."""
        config: LLMJudgeRewardConfig = self.worker_config
        if config.judge_api_base:
            self.judge = HttpJudge(config.judge_api_base, config.judge_api_model, config.judge_api_key_env,
                                   config.request_timeout_s, config.max_new_tokens, config.max_concurrency)
        else:
            model = load_causal_lm(config.judge_model_path).to(self.device)
            self.judge = LocalJudge(model, load_tokenizer(config.judge_model_path), config.max_new_tokens, config.batch_size)

    def _questions(self, data: DataProto) -> list[str]:
        if "raw_prompt" in data.non_tensor_batch:
            questions = []
            for messages in data.non_tensor_batch["raw_prompt"]:
                users = [m["content"] for m in messages if m.get("role") == "user"] if not isinstance(messages, str) else [messages]
                questions.append(users[-1] if users else "")
            return questions
        return decode_prompts(data, self.tokenizer)

    def score(self, responses: list[str], truths: list[Any], data: DataProto) -> ScoredBatch:
        if self.judge is None:
            raise RewardError("LLMJudgeRewardWorker.compute_rewards called before initialize(); call initialize first")
        config: LLMJudgeRewardConfig = self.worker_config
        answers = [split_think(r)[0] for r in responses]
        prompts = [format_judge_prompt(config.prompt_template, q, a, str(t))
                   for q, a, t in zip(self._questions(data), answers, truths)]
        verdicts = self.judge.generate(prompts)
        parsed = [parse_judge_score(v, config.scale_max) for v in verdicts]
        fallback = 0.0 if config.fallback_score is None else config.fallback_score
        rewards = [fallback if p is None else p for p in parsed]
        metrics = {
            "parsed": [float(p is not None) for p in parsed],
            "not_applicable": [float(p is None and config.fallback_score is None) for p in parsed],
        }
        return ScoredBatch(rewards, metrics=metrics)
