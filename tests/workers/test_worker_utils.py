"""Per-rank batch sizes and stage timing (rlvr.workers.worker_utils)."""

import pytest

from rlvr.utils.errors import ConfigError
from rlvr.workers.worker_utils import StageTimer, per_rank_batch_size


def test_per_rank_batch_size_counts_sequences_per_worker():
    assert per_rank_batch_size(4, 8, 2, "actor_rollout_ref.actor.ppo_mini_batch_size") == 16


def test_per_rank_batch_size_that_does_not_split_names_the_key():
    with pytest.raises(ConfigError, match="'critic.ppo_mini_batch_size'.*3 prompts x 1 samples = 3 sequences"):
        per_rank_batch_size(3, 1, 2, "critic.ppo_mini_batch_size")


def test_stage_timer_accumulates_per_stage():
    timer = StageTimer(world_size=1, device="cpu")
    for _ in range(2):
        with timer.stage("gen"):
            pass
    with timer.stage("update"):
        pass
    result = timer.result()
    assert sorted(result) == ["gen", "update"] and all(v >= 0 for v in result.values())
