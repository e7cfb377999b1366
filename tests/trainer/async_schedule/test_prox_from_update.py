"""Decoupled PPO's proximal log-probs from the update's own forward pass: when they are taken (one
optimizer step per batch, nothing before the update reads them), and that the update then equals
the update after a separate ``compute_log_prob`` pass with the driver's IS weights."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from rlvr.protocol import DataProto
from rlvr.trainer.async_schedule import prox_log_prob_from_update
from rlvr.trainer.config.loader import load_config
from rlvr.trainer.config.schema import RolloutCorrectionConfig
from rlvr.trainer.ppo.rollout_correction import (
    PROX_FROM_UPDATE_KEY,
    ProxFromUpdate,
    compute_rollout_correction_and_add_to_batch,
    compute_rollout_correction_and_rejection_mask,
    compute_rollout_mismatch_metrics,
    prox_from_update_settings,
)
from rlvr.utils.testing import tiny_causal_lm
from rlvr.workers.actor.dp_actor import DataParallelPPOActor

ONE_STEP = ["actor_rollout_ref.hybrid_engine=false", "async_training.mode=one_step"]


@pytest.mark.parametrize(("extra", "reads_old", "expected"), [
    ([], False, True),  # grpo preset: ppo_mini_batch_size == train_batch_size, one epoch
    (["async_training.prox_log_prob_from_update=false"], False, False),
    (["async_training.compute_prox_log_prob=false"], False, False),  # no decoupling: nothing to compute
    (["actor_rollout_ref.actor.ppo_epochs=2"], False, False),
    (["actor_rollout_ref.actor.ppo_mini_batch_size=4"], False, False),
    (["algorithm.rollout_correction.rollout_rs=token"], False, False),
    (["algorithm.use_kl_in_reward=true"], False, False),
    (["actor_rollout_ref.actor.strategy=megatron"], False, False),
    ([], True, False),  # an estimator that reads old_log_prob (egpo)
])
def test_the_update_gives_the_proximal_log_probs_only_where_that_is_exact(extra, reads_old, expected):
    cfg = load_config("grpo", [*ONE_STEP, *extra])
    assert prox_log_prob_from_update(cfg, reads_old) is expected


def test_sync_and_the_colocated_trainer_recompute_nothing_from_the_update():
    assert prox_log_prob_from_update(load_config("grpo", [])) is False
    assert prox_log_prob_from_update(load_config("grpo", ["actor_rollout_ref.hybrid_engine=false"])) is False


def _batch(rows: int = 8, prompt: int = 4, response: int = 5):
    gen = torch.Generator().manual_seed(3)
    lens = [5, 2, 4, 1, 5, 3, 2, 4][:rows]
    input_ids = torch.randint(4, 200, (rows, prompt + response), generator=gen)
    attention_mask = torch.ones(rows, prompt + response, dtype=torch.long)
    for row, n in enumerate(lens):
        attention_mask[row, prompt + n:] = 0
    responses = input_ids[:, prompt:].clone()
    return {"input_ids": input_ids, "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0), "responses": responses,
            "response_mask": attention_mask[:, prompt:].clone(),
            "advantages": torch.randn(rows, response, generator=gen, dtype=torch.float64)}


def _actor(mini_batch_size: int = 8):
    cfg = load_config("grpo", ["actor_rollout_ref.actor.use_kl_loss=false",
                               "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"])
    model, _ = tiny_causal_lm(dtype=torch.float64, seed=7)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    actor = DataParallelPPOActor(cfg.actor_rollout_ref.actor, model, optimizer, mini_batch_size=mini_batch_size,
                                 log_prob_micro_batch_size=3, world_size=1, device="cpu")
    return actor, model


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_the_update_equals_the_update_after_a_separate_proximal_pass(level):
    tensors = _batch()
    meta = {"temperature": 0.7}
    rc = OmegaConf.structured(RolloutCorrectionConfig(rollout_is=level, rollout_is_threshold=1.3))
    reference, reference_model = _actor()
    proximal, _ = reference.compute_log_prob(DataProto.from_dict(tensors={**tensors}, meta_info=meta))
    gen = torch.Generator().manual_seed(5)  # the behaviour policy: a few versions away from the proximal one
    tensors["rollout_log_probs"] = proximal + 0.4 * torch.randn(proximal.shape, generator=gen, dtype=proximal.dtype)

    recomputed = DataProto.from_dict(tensors={**tensors, "old_log_probs": proximal}, meta_info=dict(meta))
    _, driver_metrics = compute_rollout_correction_and_add_to_batch(recomputed, rc)
    assert 0 < driver_metrics["rollout_corr/rollout_is_ratio_fraction_high"] < 1  # some weights are capped
    expected = reference.update_policy(recomputed)

    actor, model = _actor()
    from_update = DataProto.from_dict(tensors={**tensors},
                                      meta_info={**meta, PROX_FROM_UPDATE_KEY: prox_from_update_settings(rc)})
    got = actor.update_policy(from_update)

    for name in ("actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/grad_norm"):
        assert got[name] == pytest.approx(expected[name], rel=1e-9, abs=1e-12), name
    assert got["actor/grad_norm"][0] > 0
    for a, b in zip(model.parameters(), reference_model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
    mask = tensors["response_mask"]
    mismatch = compute_rollout_mismatch_metrics(proximal, tensors["rollout_log_probs"], mask, rc.log_prob_diff_threshold)
    for name, value in {**driver_metrics, **mismatch}.items():
        assert got[name] == [pytest.approx(value, rel=1e-9, abs=1e-12)], name
    assert got["actor/prox_from_update"] == [1.0]


def test_a_batch_of_several_optimizer_steps_is_refused():
    actor, _ = _actor(mini_batch_size=4)
    rc = OmegaConf.structured(RolloutCorrectionConfig(rollout_is="token"))
    tensors = _batch()
    tensors["rollout_log_probs"] = -torch.ones(8, 5, dtype=torch.float64)
    data = DataProto.from_dict(tensors=tensors, meta_info={"temperature": 1.0,
                                                           PROX_FROM_UPDATE_KEY: prox_from_update_settings(rc)})
    with pytest.raises(ValueError, match="8 rows in mini-batches of 4 x 1 epoch\\(s\\) make more than one optimizer step"):
        actor.update_policy(data)


def test_rejection_cannot_be_applied_from_the_update():
    rc = OmegaConf.structured(RolloutCorrectionConfig(rollout_is="token", rollout_rs="token"))
    with pytest.raises(ValueError, match="rollout_is only"):
        prox_from_update_settings(rc)


@pytest.mark.parametrize("level", ["token", "sequence", None])
def test_micro_batch_weights_and_whole_batch_metrics_equal_the_driver_on_the_whole_batch(level):
    """Rows split 3 + 5 over two micro-batches: the weights of each equal the driver's rows, and the
    metrics over both equal the driver's on all 8 (min/max/ESS are whole-batch statistics)."""
    gen = torch.Generator().manual_seed(11)
    old = -torch.rand(8, 6, generator=gen) * 3
    rollout = old + torch.randn(8, 6, generator=gen) * 0.6  # several ratios above the cap of 1.5
    mask = (torch.rand(8, 6, generator=gen) > 0.25).float()
    rc = RolloutCorrectionConfig(rollout_is=level, rollout_is_threshold=1.5)
    prox = ProxFromUpdate(prox_from_update_settings(rc))
    log_prob = old.clone().requires_grad_(True)  # the update's forward pass, with its gradient
    parts = [prox.micro_batch(log_prob[rows], rollout[rows], mask[rows]) for rows in (slice(0, 3), slice(3, 8))]
    weights, _, expected = compute_rollout_correction_and_rejection_mask(old, rollout, mask, rollout_is=level,
                                                                         rollout_is_threshold=1.5)
    assert all(not part_old.requires_grad for part_old, _ in parts)
    assert torch.equal(torch.cat([part_old for part_old, _ in parts]), old)
    if level is None:
        assert all(part_weights is None for _, part_weights in parts)
    else:
        assert torch.equal(torch.cat([part_weights for _, part_weights in parts]), weights)
        assert expected["rollout_corr/rollout_is_ratio_fraction_high"] > 0
    expected.update(compute_rollout_mismatch_metrics(old, rollout, mask, rc.log_prob_diff_threshold))
    assert prox.metrics() == {**expected, "actor/prox_from_update": 1.0}


def test_no_micro_batch_seen_gives_no_metrics():
    assert ProxFromUpdate(prox_from_update_settings(RolloutCorrectionConfig(rollout_is="token"))).metrics() == {}
