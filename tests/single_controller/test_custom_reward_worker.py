"""The reward worker written from scratch (examples/custom_reward_worker.py) on a 2-worker RayWorkerGroup."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import ray.cloudpickle
import torch
from sc_workers import BACKENDS, world_size_of

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import custom_reward_worker  # noqa: E402
import run_custom_reward_worker  # noqa: E402

from rlvr.single_controller import RayClassWithInitArgs  # noqa: E402

ray.cloudpickle.register_pickle_by_value(custom_reward_worker)  # Ray workers cannot import examples/

# EXAMPLES of the runner: boxed right (+1 +0.5), boxed wrong (+0.5), "4 4 4 4 4" (3 equal trigrams:
# -0.5 * (1 - 1/3)), boxed right with a final "." (+1.5), no answer (0)
EXPECTED_SCORES = [1.5, 0.5, -1.0 / 3.0, 1.5, 0.0]


@pytest.mark.slow_on("process")
@pytest.mark.parametrize("backend", BACKENDS)
def test_custom_reward_worker_scores_a_batch(backend, make_group):
    worker = RayClassWithInitArgs(
        custom_reward_worker.CustomRewardWorker,
        worker_config=custom_reward_worker.WorkerConfig(custom_reward_worker.ModelArgs("tiny")),
    )
    group = make_group(backend, worker, name_prefix=f"custom_reward_{backend}", call_timeout_s=60)
    assert group.initialize(pipeline_config=None) == [None] * world_size_of(backend)
    data = run_custom_reward_worker.make_batch("tiny")
    out = group.compute_rewards(data)
    expected = torch.tensor(EXPECTED_SCORES, dtype=torch.float16)
    torch.testing.assert_close(out.batch["scores"], expected)
    torch.testing.assert_close(out.batch["response_level_rewards"], expected)
    assert out.batch["token_level_rewards"].shape == data.batch["responses"].shape
    assert out.batch["token_level_rewards"].dtype == torch.float16
    assert not out.batch["token_level_rewards"].any()
