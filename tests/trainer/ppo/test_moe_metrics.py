"""verl's rollout MoE load-balance metrics (``rollout/moe/...`` in metric_utils), by hand."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rlvr.trainer.ppo import metric_utils
from rlvr.trainer.ppo.metric_utils import (
    RolloutMoELoadBalanceMetricsAccumulator,
    compute_moe_lb_metrics,
    compute_rollout_moe_load_balance_metrics,
    get_metric_data_with_optional_routed_experts,
    infer_moe_num_experts,
    infer_rollout_moe_num_experts,
)


def test_counts_leave_out_each_sequences_last_token():
    # 2 sequences, response width 3, 1 layer, top-1 of 3 experts; the last valid token is filler
    routed = torch.tensor([[0, 1, 2], [2, 0, 0]]).reshape(2, 3, 1, 1)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    counts = metric_utils._compute_rollout_moe_load_counts(routed, mask, 3)
    assert counts.tolist() == [[1, 1, 1]]  # expert 0, 1 from sequence 0 and 2 from sequence 1
    m = compute_rollout_moe_load_balance_metrics(routed, mask, 3)
    assert m["rollout/moe/max_vio/layer_0"] == pytest.approx(0.0) and m["rollout/moe/avg_vio/avg"] == pytest.approx(0.0)


def test_imbalance_by_hand():
    # layer 0: experts 0, 0, 0, 1 (of 2) -> shares 3/4, 1/4 -> deviation 2 x share - 1 = 0.5, -0.5
    # layer 1: experts 1, 1, 0, 0 -> balanced
    routed = torch.tensor([[[0, 1], [0, 1], [0, 0], [1, 0], [0, 0]]]).unsqueeze(-1)  # [1, 5, 2, 1]
    mask = torch.ones(1, 5, dtype=torch.bool)
    m = compute_rollout_moe_load_balance_metrics(routed, mask, 2)
    assert m["rollout/moe/max_vio/layer_0"] == pytest.approx(0.5) and m["rollout/moe/min_vio/layer_0"] == pytest.approx(-0.5)
    assert m["rollout/moe/avg_vio/layer_0"] == pytest.approx(0.5) and m["rollout/moe/avg_vio/layer_1"] == pytest.approx(0.0)
    assert m["rollout/moe/max_vio/max"] == pytest.approx(0.5) and m["rollout/moe/max_vio/avg"] == pytest.approx(0.25)
    assert compute_rollout_moe_load_balance_metrics(routed, mask, None) == {}
    assert compute_rollout_moe_load_balance_metrics(routed + 5, mask, 2) == {}  # ids out of range


def test_accumulator_and_interval():
    acc = RolloutMoELoadBalanceMetricsAccumulator()
    batch = SimpleNamespace(batch={"routed_experts": torch.tensor([[0, 1, 0]]).reshape(1, 3, 1, 1),
                                   "response_mask": torch.ones(1, 3, dtype=torch.bool)})
    acc.update(batch.batch["routed_experts"], batch.batch["response_mask"], num_experts=2)
    assert acc.total_assignments() == 2
    acc.num_experts, acc.num_experts_initialized = 2, True
    assert compute_moe_lb_metrics(batch, 3, global_steps=2, accumulator=acc) == {}  # counted, not due
    # 3 batches of 2 counted tokens (the last of each sequence is filler)
    m = compute_moe_lb_metrics(batch, 3, global_steps=3, accumulator=acc)
    assert m["rollout/moe/routed_expert_assignments"] == 6 and m["rollout/moe/routed_experts_found"] == 1.0
    assert acc.total_assignments() == 0


def test_a_store_without_routed_experts_is_asked_again_one_interval_later():
    asked = []

    def store(keys, partition_id, select_fields):
        asked.append(list(select_fields))
        if "routed_experts" in select_fields:
            raise ValueError("no field routed_experts")
        return "rows"

    acc = RolloutMoELoadBalanceMetricsAccumulator()
    for step in (4, 5, 7):
        assert get_metric_data_with_optional_routed_experts(["k"], "train", ["a"], 3, step, acc, store) == "rows"
    assert asked == [["a", "routed_experts"], ["a"], ["a"], ["a", "routed_experts"], ["a"]]  # retried at step 7


def test_number_of_experts_from_configs(tmp_path, monkeypatch):
    assert infer_moe_num_experts({"hf_config": {"text_config": {"n_routed_experts": 6}}}) == 6
    assert infer_moe_num_experts(SimpleNamespace(model_type="mixtral", num_local_experts=8)) == 8
    assert infer_moe_num_experts({"model_type": "llama", "num_local_experts": 8}) is None
    from transformers import MixtralConfig

    MixtralConfig(num_local_experts=4).save_pretrained(tmp_path)
    section = {"path": str(tmp_path), "override_config": {"model_config": {"num_local_experts": 16}}}
    assert infer_rollout_moe_num_experts(section) == 16  # the override applied to the folder's config
    assert infer_rollout_moe_num_experts({"path": str(tmp_path)}) == 4
