"""Driver-side metrics of a training step and DAPO dynamic sampling, on hand-made batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlvr.protocol import DataProto
from rlvr.trainer.ppo.dynamic_sampling import GroupAccumulator, group_metric, informative_groups
from rlvr.trainer.ppo.metric_utils import (
    compute_data_metrics,
    compute_throughout_metrics,
    compute_timing_metrics,
    compute_variance_proxy_metrics,
    per_source_metrics,
    reduce_metrics,
    sample_accuracy,
)


def _batch() -> DataProto:
    """Two prompts of width 2 (one left-padded), responses of width 3."""
    response_mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1]])
    prompt_mask = torch.tensor([[1, 1], [1, 1], [0, 1], [0, 1]])
    scores = torch.zeros(4, 3)
    scores[0, 2], scores[1, 0], scores[2, 1], scores[3, 2] = 1.0, 0.0, 0.5, 1.0
    advantages = torch.tensor([[1.0, 1.0, 1.0], [-1.0, 9.0, 9.0], [2.0, 2.0, 9.0], [0.0, 0.0, 0.0]])
    return DataProto.from_dict(
        tensors={"prompts": torch.zeros(4, 2, dtype=torch.long), "responses": torch.zeros(4, 3, dtype=torch.long),
                 "response_mask": response_mask,
                 "attention_mask": torch.cat([prompt_mask, response_mask], dim=1),
                 "token_level_scores": scores, "token_level_rewards": scores - 0.1 * response_mask,
                 "advantages": advantages, "returns": advantages, "values": torch.zeros(4, 3)},
        non_tensors={"data_source": np.array(["a", "a", "b", "b"], dtype=object),
                     "acc": np.array([1.0, 0.0, 0.0, 1.0], dtype=object),
                     "uid": np.array(["u0", "u0", "u1", "u1"], dtype=object)})


def test_data_metrics_by_hand():
    m = compute_data_metrics(_batch(), use_critic=True)
    assert m["critic/score/mean"] == pytest.approx(2.5 / 4) and m["critic/score/max"] == 1.0
    assert m["critic/rewards/mean"] == pytest.approx((0.7 - 0.1 + 0.3 + 0.7) / 4)
    # advantages over the 9 response tokens only: 1+1+1 -1 +2+2 +0+0+0 = 6
    assert m["critic/advantages/mean"] == pytest.approx(6 / 9) and m["critic/advantages/max"] == 2.0
    assert m["response_length/mean"] == pytest.approx(9 / 4) and m["response_length/min"] == 1.0
    assert m["response_length/clip_ratio"] == 0.5
    assert m["prompt_length/mean"] == pytest.approx(1.5) and m["prompt_length/clip_ratio"] == 0.5
    assert m["response/aborted_ratio"] == 0.0 and m["response_length_non_aborted/mean"] == pytest.approx(9 / 4)
    # values 0: explained variance 1 - var(returns) / (var(returns) + 1e-5)
    returns = torch.tensor([1.0, 1.0, 1.0, -1.0, 2.0, 2.0, 0.0, 0.0, 0.0])
    assert m["critic/vf_explained_var"] == pytest.approx(1 - returns.var().item() / (returns.var().item() + 1e-5), abs=1e-6)
    assert "critic/values/mean" not in compute_data_metrics(_batch(), use_critic=False)


def test_timing_and_throughput_metrics():
    batch = _batch()  # 9 response tokens, 6 prompt tokens
    timing = {"gen": 0.9, "update_actor": 1.5, "step": 3.0}
    m = compute_timing_metrics(batch, timing)
    assert m["timing_s/gen"] == 0.9 and m["timing_s/step"] == 3.0
    assert m["timing_per_token_ms/gen"] == pytest.approx(100.0)  # 900 ms / 9 response tokens
    assert m["timing_per_token_ms/update_actor"] == pytest.approx(100.0)  # 1500 ms / 15 tokens
    assert "timing_per_token_ms/step" not in m  # verl: gen and the five training stages only
    batch.meta_info["global_token_num"] = batch.batch["attention_mask"].sum(-1).tolist()
    t = compute_throughout_metrics(batch, timing, n_gpus=2)
    assert t["perf/total_num_tokens"] == 15 and t["perf/throughput"] == pytest.approx(2.5)  # per worker


def test_sample_accuracy_and_per_source():
    scores = torch.tensor([1.0, 0.5, 1.2])
    assert sample_accuracy(scores, {}).tolist() == [1.0, 0.0, 1.0]
    assert sample_accuracy(scores, {"acc": [False, True, 0]}).tolist() == [0.0, 1.0, 0.0]
    # a routed batch: samples without an acc (None) fall back to score >= 1
    assert sample_accuracy(scores, {"acc": [None, True, None]}).tolist() == [1.0, 1.0, 1.0]
    m = per_source_metrics("val", ["x", "y", "x"], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0])
    assert m == {"val/x/score": 0.5, "val/x/acc": 0.5, "val/y/score": 0.0, "val/y/acc": 0.0, "val/acc": 1 / 3}
    assert reduce_metrics({"a": [1.0, 3.0], "b": 2}) == {"a": 2.0, "b": 2.0}
    m = per_source_metrics("train", ["a", "a", "b", "b"], [1.0, 0.0, 0.5, 1.0], [1.0, 0.0, 0.0, 1.0])
    assert m["train/a/score"] == 0.5 and m["train/b/score"] == 0.75
    assert m["train/a/acc"] == 0.5 and m["train/b/acc"] == 0.5 and m["train/acc"] == 0.5


def test_informative_groups():
    uids = np.array(["a", "a", "b", "b", "c", "d", "d"], dtype=object)
    values = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.5])
    assert informative_groups(uids, values) == ["a", "d"]  # b agrees, c is a group of one


def test_group_accumulator_keeps_informative_groups_over_batches():
    batch = _batch()  # u0 accs differ (1, 0); u1 accs differ (0, 1); scores: u0 (1, 0), u1 (0.5, 1)
    assert group_metric(batch, "score").tolist() == [1.0, 0.0, 0.5, 1.0]
    same = _batch()
    same.non_tensor_batch["acc"] = np.array([1.0, 1.0, 0.0, 1.0], dtype=object)
    same.non_tensor_batch["uid"] = np.array(["v0", "v0", "v1", "v1"], dtype=object)
    acc = GroupAccumulator("acc")
    acc.add(same)
    assert (acc.num_groups, acc.num_seen_groups) == (1, 2)  # v0 dropped
    acc.add(batch)
    assert (acc.num_groups, acc.num_seen_groups) == (3, 4)
    assert acc.seen_acc == [1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0]
    assert acc.seen_scores == [1.0, 0.0, 0.5, 1.0, 1.0, 0.0, 0.5, 1.0]
    taken = acc.take(2, group_size=2)
    assert taken.non_tensor_batch["uid"].tolist() == ["v1", "v1", "u0", "u0"]
    assert GroupAccumulator("acc").take(2, 2) is None


def _variance_batch(with_weights: bool) -> DataProto:
    """Two responses, mask (1, 1, 0) and (1, 0, 0); pi of the sampled tokens and sum_v pi^2 chosen
    so that the per-token energies w = 1 - 2 pi + sum pi^2 are (0.5, 0.25, -) and (1.0, -, -)."""
    pi = torch.tensor([[0.5, 0.5, 0.9], [0.25, 0.9, 0.9]])
    energy = torch.tensor([[0.5, 0.25, 0.0], [1.0, 0.0, 0.0]])
    tensors = {"response_mask": torch.tensor([[1, 1, 0], [1, 0, 0]]), "old_log_probs": pi.log(),
               "sum_pi_squared": energy - 1 + 2 * pi, "advantages": torch.tensor([[1.0, 3.0, 7.0], [-2.0, 5.0, 5.0]])}
    if with_weights:
        tensors["rollout_is_weights"] = torch.tensor([[2.0, 1.0, 1.0], [0.5, 1.0, 1.0]])
    return DataProto.from_dict(tensors=tensors)


def test_variance_proxy_metrics_by_hand():
    """Mean advantages A = (2, -2); path energies W = (0.75, 1.0): E[A^2] = 4, E[W] = 0.875,
    total power mean(A^2 W) = (3 + 4) / 2 = 3.5, noise (3.5 - 0.5^2) / 1."""
    metrics = compute_variance_proxy_metrics(_variance_batch(False), gradient_norm=0.5)
    assert metrics == pytest.approx({
        "variance_proxy/proxy1_signal_strength": 0.25, "variance_proxy/proxy2_total_power": 3.5,
        "variance_proxy/proxy3_pure_noise": 3.25, "variance_proxy/expected_a_squared": 4.0,
        "variance_proxy/expected_w": 0.875})
    assert compute_variance_proxy_metrics(_variance_batch(False))["variance_proxy/proxy3_pure_noise"] == 0.0
    assert compute_variance_proxy_metrics(DataProto.from_dict(tensors={"advantages": torch.zeros(1, 1)})) == {}


def test_variance_proxy_metrics_with_is_weights_by_hand():
    """Weights (2, 1) and (0.5): W scaled by rho^2 = (2.0 + 0.25, 0.25) for E[W]; the total power
    uses the unweighted W (0.75, 1.0) times the square of each response's mean weight (1.5, 0.5)."""
    metrics = compute_variance_proxy_metrics(_variance_batch(True))
    assert metrics["variance_proxy/expected_w"] == pytest.approx((2.25 + 0.25) / 2)
    assert metrics["variance_proxy/proxy2_total_power"] == pytest.approx((1.5**2 * 4 * 0.75 + 0.5**2 * 4 * 1.0) / 2)


def test_aborted_samples_are_left_out_of_the_score_statistics():
    batch = _batch()
    batch.batch["attention_mask"][1, 2:] = 0  # sample 1 has no response tokens (aborted)
    batch.batch["token_level_scores"][1, 0] = -5.0
    m = compute_data_metrics(batch, use_critic=False)
    assert m["response/aborted_ratio"] == 0.25 and m["critic/score/min"] == 0.5  # -5 left out
    assert m["response_length/min"] == 0.0 and m["response_length_non_aborted/min"] == 2.0
