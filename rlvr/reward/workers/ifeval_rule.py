"""``GeneralRuleRewardWorker``: IFEval instruction following (Zhou et al., 2023, arXiv:2311.07911)."""

from __future__ import annotations

from typing import Any

from rlvr.protocol import DataProto
from rlvr.reward.config import GeneralRuleRewardConfig
from rlvr.reward.decode import extra_infos
from rlvr.reward.scorers.ifeval import evaluate, parse_ground_truth
from rlvr.reward.workers.base import RuleRewardWorker, ScoredBatch, split_think
from rlvr.reward.workers.registry import register_reward_worker
from rlvr.utils.errors import ConfigError


@register_reward_worker("ifeval", GeneralRuleRewardConfig)
class GeneralRuleRewardWorker(RuleRewardWorker):
    """Reward = how well the response follows its IFEval instructions.

    The instructions come from ``extra_info`` when it has ``instruction_id_list`` (and ``kwargs``),
    else from the ground truth (a dict or JSON string in IFEval's format). The response checked is
    the answer part (after ``</think>``; an unclosed ``<think>`` leaves it empty, which fails every
    instruction). Metrics per sample: ``reward/ifeval/{prompt_strict,prompt_loose,instruction_strict,
    instruction_loose}`` (prompt level: all instructions pass; instruction level: fraction passing).
    """

    metric_prefix = "ifeval"

    def __init__(self, worker_config: GeneralRuleRewardConfig) -> None:
        if worker_config.reward_mode not in ("fraction", "all"):
            raise ConfigError("reward_mode", f"must be 'fraction' or 'all', got {worker_config.reward_mode!r}")
        super().__init__(worker_config)

    def score(self, responses: list[str], truths: list[Any], data: DataProto) -> ScoredBatch:
        config: GeneralRuleRewardConfig = self.worker_config
        rewards = []
        metrics: dict[str, list[float]] = {k: [] for k in ("prompt_strict", "prompt_loose", "instruction_strict", "instruction_loose")}
        for response, truth, info in zip(responses, truths, extra_infos(data)):
            source = info if "instruction_id_list" in info else truth
            result = evaluate(split_think(response)[0], *parse_ground_truth(source))
            flags = result.loose if config.loose else result.strict
            rewards.append(sum(flags) / len(flags) if config.reward_mode == "fraction" else float(all(flags)))
            metrics["prompt_strict"].append(float(result.prompt_strict))
            metrics["prompt_loose"].append(float(result.prompt_loose))
            metrics["instruction_strict"].append(result.instruction_strict)
            metrics["instruction_loose"].append(result.instruction_loose)
        return ScoredBatch(rewards, metrics=metrics)
