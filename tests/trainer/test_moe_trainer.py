"""A GRPO run of a tiny Qwen3-MoE policy on the local backend: the rollout's routes replayed (R3),
the load-balancing loss in the actor's loss, the MoE metrics of the actor and the rollout."""

from __future__ import annotations

import pytest
from trainer_helpers import tiny_config

from rlvr.trainer.main_ppo import run_ppo
from rlvr.trainer.tracking import read_metrics
from rlvr.utils.tiny_moe import save_tiny_moe


@pytest.fixture(scope="module")
def moe_model_dir(tmp_path_factory):
    return save_tiny_moe(tmp_path_factory.mktemp("moe_model") / "model", "qwen3_moe")


def test_grpo_with_rollout_routing_replay(moe_model_dir, tiny_data, tmp_path):
    cfg = tiny_config(moe_model_dir, tiny_data, tmp_path / "run", **{
        "trainer.total_training_steps": 2, "trainer.val_before_train": False,
        "actor_rollout_ref.actor.use_rollout_log_probs": False,
        "actor_rollout_ref.rollout.enable_rollout_routing_replay": True,
        "actor_rollout_ref.rollout.moe_load_balance_metrics_interval": 2,
        "actor_rollout_ref.actor.fsdp_config.router_replay.mode": "R3",
        "actor_rollout_ref.model.override_config.output_router_logits": True,
    })
    run_ppo(cfg)
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "actor/pg_loss" in r]
    assert len(rows) == 2
    for row in rows:
        assert row["actor/moe_aux_loss"] > 0
        assert 0 < row["actor/moe_load_entropy/layer_0"] <= 2.0795  # log 8
        assert row["training/rollout_log_probs_diff_max"] < 1e-5  # fp32 engine on the actor's module, same routes
    assert "rollout/moe/max_vio/avg" not in rows[0]  # logged every 2 steps
    assert rows[1]["rollout/moe/routed_experts_found"] == 1.0
    assert rows[1]["rollout/moe/max_vio/layer_1"] >= rows[1]["rollout/moe/avg_vio/layer_1"] >= 0
    assert rows[1]["rollout/moe/min_vio/max"] <= 0
