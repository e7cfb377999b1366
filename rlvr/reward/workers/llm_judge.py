"""``LLMJudgeRewardWorker``: another LLM grades the response (Zheng et al., 2023, arXiv:2306.05685)."""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import Any

from rlvr.protocol import DataProto
from rlvr.reward.config import LLMJudgeRewardConfig
from rlvr.reward.decode import decode_prompts
from rlvr.reward.scorers.judge import HttpJudge, LocalJudge, format_judge_prompt, parse_judge_score
from rlvr.reward.workers.base import RuleRewardWorker, ScoredBatch, split_think
from rlvr.reward.workers.registry import register_reward_worker
from rlvr.single_controller.base.decorator import Dispatch, register
from rlvr.utils.errors import ConfigError, RewardError
from rlvr.utils.model import load_causal_lm, load_tokenizer
from rlvr.utils.user_code import UserCodeError, load_object
from rlvr.workers.rollout.server.openai_server import ManagedOpenAIServer


def _user_function(path: str, key: str) -> Callable:
    """The function at the object path ``path`` (``reward.workers.llm_judge.<key>``)."""
    try:
        function = load_object(path)
    except UserCodeError as err:
        raise ConfigError(f"reward.workers.llm_judge.{key}", str(err)) from None
    if not callable(function):
        raise ConfigError(f"reward.workers.llm_judge.{key}", f"{path!r} is a {type(function).__name__}, not a function")
    return function


@register_reward_worker("llm_judge", LLMJudgeRewardConfig)
class LLMJudgeRewardWorker(RuleRewardWorker):
    """Reward = the judge's score in [0, 1] for (question, response, reference).

    The question is the last user message of ``non_tensor_batch["raw_prompt"]`` when present, else
    the decoded prompt; the reference is the ground truth; the response is its answer part (after
    ``</think>``). The judge is a local transformers model (default), an OpenAI-compatible endpoint
    (``judge_api_base``), or a vLLM server replica of ``judge_model_path`` that the worker starts
    (``judge_server.enable``); the last two go through one client (:class:`HttpJudge`: time limit,
    retries, a cap on requests in flight). The prompt is ``prompt_template`` or your ``prompt_fn``;
    the verdict is read by :func:`parse_judge_score` or your ``score_parser``. A verdict that cannot
    be read gets ``fallback_score``, or 0.0 and counts as not applicable when that is None. Metrics:
    ``reward/llm_judge/{parsed,not_applicable}``.
    """

    metric_prefix = "llm_judge"

    def __init__(self, worker_config: LLMJudgeRewardConfig) -> None:
        super().__init__(worker_config)
        self.judge: LocalJudge | HttpJudge | None = None
        self.server: ManagedOpenAIServer | None = None
        self.build_prompt = _user_function(worker_config.prompt_fn, "prompt_fn") if worker_config.prompt_fn else None
        self.parse = _user_function(worker_config.score_parser, "score_parser") if worker_config.score_parser else parse_judge_score

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def initialize(self, pipeline_config: Any = None) -> None:
        """Set up the judge: the HTTP client of ``judge_api_base``, or of a vLLM server replica of
        ``judge_model_path`` started here (``judge_server.enable``; stopped with the worker), or
        the local transformers model on this worker's device."""
        config: LLMJudgeRewardConfig = self.worker_config
        api_base = config.judge_api_base
        if api_base is None and config.judge_server.enable:
            api_key = os.environ.get(config.judge_api_key_env) if config.judge_api_key_env else None
            self.server = ManagedOpenAIServer(config.judge_model_path, config.judge_api_model, config.judge_server,
                                              api_key=api_key)
            weakref.finalize(self, self.server.stop)
            self.server.start()
            api_base = self.server.api_base
        if api_base is not None:
            self.judge = HttpJudge(api_base, config.judge_api_model, config.judge_api_key_env,
                                   config.request_timeout_s, config.max_new_tokens, config.max_concurrency,
                                   config.max_retries, config.retry_backoff_s)
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

    def _prompt(self, question: str, answer: str, reference: str) -> str:
        if self.build_prompt is None:
            return format_judge_prompt(self.worker_config.prompt_template, question, answer, reference)
        prompt = self.build_prompt(question, answer, reference)
        if not isinstance(prompt, str):
            raise RewardError(f"reward.workers.llm_judge.prompt_fn returned a {type(prompt).__name__}; it must return "
                              "the judge prompt as a str")
        return prompt

    def score(self, responses: list[str], truths: list[Any], data: DataProto) -> ScoredBatch:
        if self.judge is None:
            raise RewardError("LLMJudgeRewardWorker.compute_rewards called before initialize(); call initialize first")
        config: LLMJudgeRewardConfig = self.worker_config
        answers = [split_think(r)[0] for r in responses]
        prompts = [self._prompt(q, a, str(t)) for q, a, t in zip(self._questions(data), answers, truths)]
        verdicts = self.judge.generate(prompts)
        parsed = [self._parsed(v, config.scale_max) for v in verdicts]
        fallback = 0.0 if config.fallback_score is None else config.fallback_score
        rewards = [fallback if p is None else p for p in parsed]
        metrics = {
            "parsed": [float(p is not None) for p in parsed],
            "not_applicable": [float(p is None and config.fallback_score is None) for p in parsed],
        }
        return ScoredBatch(rewards, metrics=metrics)

    def _parsed(self, verdict: str, scale_max: float) -> float | None:
        value = self.parse(verdict, scale_max)
        if value is not None and not (isinstance(value, (int, float)) and 0.0 <= float(value) <= 1.0):
            raise RewardError(f"the judge's score parser returned {value!r} for {verdict[:80]!r}; it must return a "
                              "number in [0, 1] or None (no verdict)")
        return None if value is None else float(value)
