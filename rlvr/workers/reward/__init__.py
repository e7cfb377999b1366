"""The reward workers of seed 002: rule, sandbox, judge, IFEval and detection rewards.

Each is a ``Worker`` with ``initialize(pipeline_config)`` (``Dispatch.ONE_TO_ALL``) and
``compute_rewards(data)`` (``Dispatch.DP_MP_COMPUTE``) returning ``token_level_rewards``,
``response_level_rewards`` and ``scores`` (see :mod:`rlvr.workers.reward.base`).
"""

from rlvr.workers.reward.base import RewardWorkerConfig, RuleRewardWorker, ScoredBatch
from rlvr.workers.reward.code_sandbox import CodeSandboxRewardConfig, CodeSandboxRewardWorker
from rlvr.workers.reward.detection import DetectionRewardConfig, DetectionRewardWorker
from rlvr.workers.reward.ifeval_rule import GeneralRuleRewardConfig, GeneralRuleRewardWorker
from rlvr.workers.reward.llm_judge import LLMJudgeRewardConfig, LLMJudgeRewardWorker
from rlvr.workers.reward.math_rule import MathRuleRewardConfig, MathRuleRewardWorker
from rlvr.workers.reward.qa_rule import (
    CrossThinkQARuleRewardConfig,
    CrossThinkQARuleRewardWorker,
    GeneralValRuleRewardConfig,
    GeneralValRuleRewardWorker,
    MultipleChoiceBoxedRuleRewardConfig,
    MultipleChoiceBoxedRuleRewardWorker,
)

__all__ = [
    "CodeSandboxRewardConfig",
    "CodeSandboxRewardWorker",
    "CrossThinkQARuleRewardConfig",
    "CrossThinkQARuleRewardWorker",
    "DetectionRewardConfig",
    "DetectionRewardWorker",
    "GeneralRuleRewardConfig",
    "GeneralRuleRewardWorker",
    "GeneralValRuleRewardConfig",
    "GeneralValRuleRewardWorker",
    "LLMJudgeRewardConfig",
    "LLMJudgeRewardWorker",
    "MathRuleRewardConfig",
    "MathRuleRewardWorker",
    "MultipleChoiceBoxedRuleRewardConfig",
    "MultipleChoiceBoxedRuleRewardWorker",
    "RewardWorkerConfig",
    "RuleRewardWorker",
    "ScoredBatch",
]
