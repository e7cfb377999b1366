"""``MathRuleRewardWorker``: math answers checked with math-verify (reuses
:func:`rlvr.reward.scorers.math.compute_score`)."""

from __future__ import annotations

from typing import Any

from rlvr.protocol import DataProto
from rlvr.reward.config import MathRuleRewardConfig
from rlvr.reward.scorers import ScorerTimeoutError
from rlvr.reward.scorers.math import compute_score as math_score
from rlvr.reward.workers.base import RuleRewardWorker, ScoredBatch, split_think
from rlvr.reward.workers.registry import register_reward_worker


@register_reward_worker("math_rule", MathRuleRewardConfig)
class MathRuleRewardWorker(RuleRewardWorker):
    """Reward 1.0 when the last ``\\boxed{}`` of the answer equals the ground truth (math-verify, so
    ``\\frac{1}{2}``, ``0.5`` and ``1/2`` agree), else 0.0.

    ``<think>`` handling: the answer is the text after the last ``</think>``; a response whose
    ``<think>`` is never closed has not answered and gets 0.0 (counted in ``reward/math/format_error``).
    Metrics: ``reward/math/{correct,format_error,timeout}`` per sample.
    """

    metric_prefix = "math"

    def score(self, responses: list[str], truths: list[Any], data: DataProto) -> ScoredBatch:
        config: MathRuleRewardConfig = self.worker_config
        rewards, correct, format_error, timeout = [], [], [], []
        for response, truth in zip(responses, truths):
            answer, well_formed = split_think(response)
            timed_out, value = False, 0.0
            if well_formed:
                try:
                    value = math_score(answer, truth, timeout_s=config.timeout_s)["score"]
                except ScorerTimeoutError:
                    timed_out, value = True, config.timeout_score
            rewards.append(value)
            correct.append(float(value == 1.0 and not timed_out))
            format_error.append(float(not well_formed))
            timeout.append(float(timed_out))
        return ScoredBatch(rewards, metrics={"correct": correct, "format_error": format_error, "timeout": timeout})
