"""The typed configuration of offline evaluation (``rlvr.trainer.main_eval``): verl 0.9.1's
``evaluation.yaml`` keys, plus rlvr's scoring time limit and output file."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from rlvr.reward.config import CustomRewardFunctionConfig
from rlvr.trainer.config.schema import _f, _sub

__all__ = ["EvalConfig"]


@dataclass
class EvalDataConfig:
    path: Optional[str] = _f(None, "the parquet file to score (main_generation_server's output)")
    prompt_key: str = _f("prompt", "column of the prompts (kept for verl's configs; scoring reads responses)")
    response_key: str = _f("responses", "column with each row's list of responses")
    data_source_key: str = _f("data_source", "column naming each row's data source (selects the scorer, groups the metrics)")
    reward_model_key: str = _f("reward_model", "column with each row's reward_model dict (its ground_truth is scored against)")
    output_path: Optional[str] = _f(None, "rlvr: also write the metrics as JSON to this file (None = print only)")


@dataclass
class RayInitConfig:
    num_cpus: Optional[int] = _f(None, "processes that score in parallel (verl: CPUs of its Ray cluster; None = this machine's cores)")


@dataclass
class RayKwargsConfig:
    ray_init: RayInitConfig = _sub(RayInitConfig, "verl's ray.init arguments: num_cpus sets the scoring processes")
    timeline_json_file: Optional[str] = _f(None, "verl: a Ray timeline file (only null: rlvr scores in a process pool, not on Ray)")


@dataclass
class EvalScoringConfig:
    timeout_s: float = _f(60.0, "rlvr: time limit of one response's scoring; a response over it is an error naming its row")


@dataclass
class EvalConfig:
    """The whole evaluation."""

    data: EvalDataConfig = _sub(EvalDataConfig, "the generated file and its columns")
    custom_reward_function: CustomRewardFunctionConfig = _sub(CustomRewardFunctionConfig, "your scoring function (null path: rlvr's scorers by data source)")
    ray_kwargs: RayKwargsConfig = _sub(RayKwargsConfig, "verl's Ray settings of the scoring")
    scoring: EvalScoringConfig = _sub(EvalScoringConfig, "rlvr: limits of the scoring processes")
