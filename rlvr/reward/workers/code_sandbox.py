"""``CodeSandboxRewardWorker``: run the generated code against the sample's tests in a sandbox."""

from __future__ import annotations

import time
from typing import Any

from rlvr.protocol import DataProto
from rlvr.reward.config import CodeSandboxRewardConfig
from rlvr.reward.scorers.code import CodeTask, build_task, extract_code, grade
from rlvr.reward.workers.base import RuleRewardWorker, ScoredBatch, split_think
from rlvr.reward.workers.registry import register_reward_worker
from rlvr.sandbox import HttpSandboxClient, LocalSandbox, SandboxJob
from rlvr.single_controller.base.decorator import Dispatch, register
from rlvr.utils.errors import RewardError


@register_reward_worker("code_sandbox", CodeSandboxRewardConfig)
class CodeSandboxRewardWorker(RuleRewardWorker):
    """Reward = test outcome of the code in the answer (see :mod:`rlvr.reward.scorers.code` for
    the ground-truth formats: stdin/stdout, assert-style, HumanEval ``check(candidate)``).

    All test runs of the batch go to the sandbox together, at most ``sandbox.max_concurrency`` at a
    time (or concurrent HTTP requests to ``sandbox_url``). A program that loops, forks, allocates
    or writes without bounds is killed at its limits and fails. Metrics per sample:
    ``reward/code/{pass,no_code,timeout,runtime_error}`` and ``reward/code/samples_per_s`` (batch throughput).
    """

    metric_prefix = "code"

    def __init__(self, worker_config: CodeSandboxRewardConfig) -> None:
        super().__init__(worker_config)
        self.runner: LocalSandbox | HttpSandboxClient | None = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def initialize(self, pipeline_config: Any = None) -> None:
        """Start the sandbox (probes the kernel's isolation features once) or the HTTP client."""
        config: CodeSandboxRewardConfig = self.worker_config
        if config.sandbox_url:
            self.runner = HttpSandboxClient(
                config.sandbox_url, wall_timeout_s=config.sandbox.wall_timeout_s,
                request_timeout_s=config.request_timeout_s, max_concurrency=config.sandbox.max_concurrency,
            )
        else:
            self.runner = LocalSandbox(config.sandbox)

    def score(self, responses: list[str], truths: list[Any], data: DataProto) -> ScoredBatch:
        if self.runner is None:
            raise RewardError("CodeSandboxRewardWorker.compute_rewards called before initialize(); call initialize first")
        config: CodeSandboxRewardConfig = self.worker_config
        start = time.monotonic()
        tasks: list[CodeTask | None] = []
        for response, truth in zip(responses, truths):
            answer, well_formed = split_think(response)
            code = extract_code(answer, config.allow_raw_code) if well_formed else None
            tasks.append(None if code is None else build_task(code, truth))
        jobs: list[SandboxJob] = [job for task in tasks if task is not None for job in task.jobs]
        results = iter(self.runner.run_many(jobs))
        rewards, metrics = [], {"pass": [], "no_code": [], "timeout": [], "runtime_error": []}
        for task in tasks:
            own = [] if task is None else [next(results) for _ in task.jobs]
            reward = 0.0 if task is None else grade(task, own, config.partial_credit)
            rewards.append(reward)
            metrics["pass"].append(float(task is not None and all(r.passed for r in own) and reward == 1.0))
            metrics["no_code"].append(float(task is None))
            metrics["timeout"].append(float(any(r.status in ("timeout", "killed") for r in own)))
            metrics["runtime_error"].append(float(any(r.status == "runtime_error" for r in own)))
        elapsed = max(time.monotonic() - start, 1e-9)
        metrics["samples_per_s"] = [len(responses) / elapsed] * len(responses)
        return ScoredBatch(rewards, metrics=metrics)
