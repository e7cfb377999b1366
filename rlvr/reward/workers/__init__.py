"""The reward workers: rule, sandbox, judge, IFEval and detection rewards, each a worker group of
its own in a training run (routed by ``reward.routes``).

Each is a ``Worker`` with ``initialize(pipeline_config)`` (``Dispatch.ONE_TO_ALL``) and
``compute_rewards(data)`` (``Dispatch.DP_MP_COMPUTE``) returning ``token_level_rewards``,
``response_level_rewards`` and ``scores`` (see :mod:`rlvr.reward.workers.base`), registered under
the route name in brackets: ``MathRuleRewardWorker`` (``math_rule``), ``CodeSandboxRewardWorker``
(``code_sandbox``), ``LLMJudgeRewardWorker`` (``llm_judge``), ``GeneralValRuleRewardWorker``
(``general_val``), ``CrossThinkQARuleRewardWorker`` (``crossthinkqa``),
``MultipleChoiceBoxedRuleRewardWorker`` (``mc_boxed``), ``GeneralRuleRewardWorker`` (``ifeval``),
``DetectionRewardWorker`` (``detection``). Their configs live in :mod:`rlvr.reward.config`.
"""

from rlvr.reward.config import (
    CodeSandboxRewardConfig,
    CrossThinkQARuleRewardConfig,
    DetectionRewardConfig,
    GeneralRuleRewardConfig,
    GeneralValRuleRewardConfig,
    LLMJudgeRewardConfig,
    MathRuleRewardConfig,
    MultipleChoiceBoxedRuleRewardConfig,
    RewardWorkerConfig,
)
from rlvr.reward.workers.base import RuleRewardWorker, ScoredBatch
from rlvr.reward.workers.code_sandbox import CodeSandboxRewardWorker
from rlvr.reward.workers.detection import DetectionRewardWorker
from rlvr.reward.workers.ifeval_rule import GeneralRuleRewardWorker
from rlvr.reward.workers.llm_judge import LLMJudgeRewardWorker
from rlvr.reward.workers.math_rule import MathRuleRewardWorker
from rlvr.reward.workers.qa_rule import (
    CrossThinkQARuleRewardWorker,
    GeneralValRuleRewardWorker,
    MultipleChoiceBoxedRuleRewardWorker,
)
from rlvr.reward.workers.registry import (
    REWARD_WORKER_REGISTRY,
    RewardWorkerSpec,
    get_reward_worker,
    register_reward_worker,
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
    "REWARD_WORKER_REGISTRY",
    "RewardWorkerConfig",
    "RewardWorkerSpec",
    "RuleRewardWorker",
    "ScoredBatch",
    "get_reward_worker",
    "register_reward_worker",
]
