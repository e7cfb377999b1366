"""The reward workers at their documented path; they live in :mod:`rlvr.reward.workers` (see
:mod:`rlvr.reward.legacy_paths`)."""

import sys

from rlvr.reward.legacy_paths import alias_submodules
from rlvr.reward.workers import (
    REWARD_WORKER_REGISTRY,
    CodeSandboxRewardConfig,
    CodeSandboxRewardWorker,
    CrossThinkQARuleRewardConfig,
    CrossThinkQARuleRewardWorker,
    DetectionRewardConfig,
    DetectionRewardWorker,
    GeneralRuleRewardConfig,
    GeneralRuleRewardWorker,
    GeneralValRuleRewardConfig,
    GeneralValRuleRewardWorker,
    LLMJudgeRewardConfig,
    LLMJudgeRewardWorker,
    MathRuleRewardConfig,
    MathRuleRewardWorker,
    MultipleChoiceBoxedRuleRewardConfig,
    MultipleChoiceBoxedRuleRewardWorker,
    RewardWorkerConfig,
    RewardWorkerSpec,
    RuleRewardWorker,
    ScoredBatch,
    get_reward_worker,
    register_reward_worker,
)

_SUBMODULES = ("base", "code_sandbox", "detection", "ifeval_rule", "llm_judge", "math_rule", "qa_rule", "registry")
alias_submodules(sys.modules[__name__], {name: f"rlvr.reward.workers.{name}" for name in _SUBMODULES})

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
    "REWARD_WORKER_REGISTRY",
    "RewardWorkerConfig",
    "RewardWorkerSpec",
    "RuleRewardWorker",
    "ScoredBatch",
    "get_reward_worker",
    "register_reward_worker",
]
