"""verl's rollout-correction keys against loop implementations written here: IcePop's
``"lower_upper"`` threshold, rollout_is_batch_normalize, verl's rejection options (token_k1,
seq_mean_k3, ... with per-option thresholds), and bypass mode's loss_type=reinforce."""

from __future__ import annotations

import math

import pytest
import torch

from rlvr.trainer.config import check_config, load_config
from rlvr.trainer.ppo.rollout_correction import (
    compute_policy_loss_reinforce,
    compute_rollout_correction_and_rejection_mask,
)
from rlvr.utils.errors import ConfigError

OLD = torch.tensor([[-1.0, -0.5, -2.0, -0.1], [-0.3, -1.2, -0.7, 0.0]])
ROLLOUT = torch.tensor([[-1.5, -0.4, -0.9, -0.1], [-0.2, -2.5, -0.6, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]])


def _ratios() -> list[list[float]]:
    return [[math.exp(o - r) for o, r in zip(orow, rrow)] for orow, rrow in zip(OLD.tolist(), ROLLOUT.tolist())]


def test_icepop_band_zeroes_the_weights_outside_it():
    weights, mask, metrics = compute_rollout_correction_and_rejection_mask(
        OLD, ROLLOUT, MASK, rollout_is="token", rollout_is_threshold="0.5_2.0")
    expected = [[rho if 0.5 <= rho <= 2.0 and m else 0.0 for rho, m in zip(row, mrow)]
                for row, mrow in zip(_ratios(), MASK.tolist())]
    assert weights.flatten().tolist() == pytest.approx(sum(expected, []), abs=1e-6)
    assert torch.equal(mask, MASK) and "rollout_corr/rollout_is_mean" in metrics
    capped, _, _ = compute_rollout_correction_and_rejection_mask(OLD, ROLLOUT, MASK, rollout_is="token",
                                                                 rollout_is_threshold="2.0")
    assert capped.flatten().tolist() == pytest.approx([min(rho, 2.0) * m for row, mrow in zip(_ratios(), MASK.tolist())
                                                       for rho, m in zip(row, mrow)], abs=1e-6)


def test_batch_normalize_makes_the_weights_average_one():
    weights, _, metrics = compute_rollout_correction_and_rejection_mask(
        OLD, ROLLOUT, MASK, rollout_is="token", rollout_is_threshold=2.0, rollout_is_batch_normalize=True)
    raw = [min(rho, 2.0) * m for row, mrow in zip(_ratios(), MASK.tolist()) for rho, m in zip(row, mrow)]
    mean = sum(raw) / 7
    assert metrics["rollout_corr/rollout_is_batch_norm_factor"] == pytest.approx(mean)
    assert weights.flatten().tolist() == pytest.approx([w / mean for w in raw], abs=1e-6)
    sequence, _, seq_metrics = compute_rollout_correction_and_rejection_mask(
        OLD, ROLLOUT, MASK, rollout_is="sequence", rollout_is_threshold=5.0, rollout_is_batch_normalize=True)
    per_seq = [min(math.exp(sum((o - r) * m for o, r, m in zip(orow, rrow, mrow))), 5.0)
               for orow, rrow, mrow in zip(OLD.tolist(), ROLLOUT.tolist(), MASK.tolist())]
    assert seq_metrics["rollout_corr/rollout_is_batch_norm_factor"] == pytest.approx(sum(per_seq) / 2)
    assert sequence[0, 0].item() == pytest.approx(per_seq[0] / (sum(per_seq) / 2))


def _k_stats(o: float, r: float) -> tuple[float, float, float]:
    lr = o - r
    return -lr, 0.5 * lr * lr, math.exp(lr) - 1 - lr


def test_verls_rejection_options_with_per_option_thresholds():
    """token_k1 in [log 0.5, log 2] and seq_mean_k3 <= 0.05, both must pass (a loop reference)."""
    _, mask, metrics = compute_rollout_correction_and_rejection_mask(
        OLD, ROLLOUT, MASK, rollout_rs="token_k1,seq_mean_k3", rollout_rs_threshold="0.5_2.0,0.05")
    expected = []
    for orow, rrow, mrow in zip(OLD.tolist(), ROLLOUT.tolist(), MASK.tolist()):
        k3 = [_k_stats(o, r)[2] for o, r, m in zip(orow, rrow, mrow) if m]
        seq_ok = sum(k3) / len(k3) <= 0.05
        expected.append([float(m and seq_ok and math.log(0.5) <= _k_stats(o, r)[0] <= math.log(2.0))
                         for o, r, m in zip(orow, rrow, mrow)])
    assert mask.tolist() == expected
    assert set(metrics) >= {"rollout_corr/rollout_rs_token_k1_masked_fraction",
                            "rollout_corr/rollout_rs_seq_mean_k3_masked_fraction", "rollout_corr/rollout_rs_masked_fraction"}
    _, k1_only, _ = compute_rollout_correction_and_rejection_mask(OLD, ROLLOUT, MASK, rollout_rs="token_k1",
                                                                  rollout_rs_threshold=2.0)  # lower = 1/2
    assert k1_only.tolist() == [[float(m and abs(_k_stats(o, r)[0]) <= math.log(2.0)) for o, r, m in zip(*rows)]
                                for rows in zip(OLD.tolist(), ROLLOUT.tolist(), MASK.tolist())]


def test_reinforce_loss_is_the_weighted_policy_gradient():
    log_prob = torch.tensor([[-0.9, -0.6], [-1.1, -0.2]], requires_grad=True)
    rollout = torch.tensor([[-1.0, -0.5], [-1.0, -0.4]])
    adv = torch.tensor([[1.0, 1.0], [-2.0, -2.0]])
    mask = torch.ones(2, 2)
    weights = torch.tensor([[1.5, 1.0], [0.5, 2.0]])
    loss, metrics = compute_policy_loss_reinforce(rollout, log_prob, adv, mask, "token-mean", None, weights)
    expected = sum(-a * lp * w for a, lp, w in zip(adv.flatten().tolist(), log_prob.detach().flatten().tolist(),
                                                   weights.flatten().tolist())) / 4
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    loss.backward()
    assert log_prob.grad.flatten().tolist() == pytest.approx([-a * w / 4 for a, w in zip(adv.flatten().tolist(),
                                                                                        weights.flatten().tolist())])
    assert metrics["ppo_kl"].item() == pytest.approx((rollout - log_prob.detach()).mean().item(), rel=1e-5)


def test_bypass_reinforce_in_the_actor_weights_the_policy_gradient(tmp_path):
    """The actor in bypass mode with loss_type=reinforce: its micro-batch loss is the REINFORCE loss
    with the truncated IS weights of pi_theta / pi_rollout."""
    from rlvr.trainer.ppo.rollout_correction import BYPASS_RS_KEY, bypass_old_log_probs
    from rlvr.protocol import DataProto
    from rlvr.utils.testing import save_tiny_model
    from rlvr.workers.actor.dp_actor import DataParallelPPOActor
    from rlvr.workers.models import build_causal_lm

    model = save_tiny_model(tmp_path / "m")
    cfg = load_config(None, [f"actor_rollout_ref.model.path={model}", "algorithm.rollout_correction.bypass_mode=true",
                             "algorithm.rollout_correction.loss_type=reinforce",
                             "algorithm.rollout_correction.rollout_is=token",
                             "algorithm.rollout_correction.rollout_is_threshold=1.5"])
    actor = DataParallelPPOActor(cfg.actor_rollout_ref.actor, build_causal_lm(cfg.actor_rollout_ref.model, False),
                                 None, mini_batch_size=2, log_prob_micro_batch_size=2, world_size=1, device="cpu")
    ids = torch.tensor([[1, 5, 6, 7, 8], [1, 9, 10, 11, 12]])
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "position_ids": torch.arange(5).repeat(2, 1),
             "responses": ids[:, 3:], "response_mask": torch.ones(2, 2), "advantages": torch.tensor([[1.0], [-1.0]])
             .expand(2, 2), "rollout_log_probs": torch.tensor([[-5.0, -5.5], [-5.2, -5.8]])}
    data = DataProto.from_dict({k: v.clone() for k, v in batch.items()})
    bypass_old_log_probs(data, cfg.algorithm.rollout_correction)
    settings = data.meta_info[BYPASS_RS_KEY]
    micro = {k: data.batch[k] for k in data.batch.keys()}
    loss, _ = actor._micro_loss(micro, 1.0, settings)
    log_prob, _ = actor._forward(micro, 1.0, False, False)
    weights = torch.exp(log_prob.detach() - batch["rollout_log_probs"]).clamp(max=1.5)
    expected = (-batch["advantages"] * log_prob * weights).mean()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)


def test_config_checks_of_the_verl_forms():
    base = ["algorithm.rollout_correction.bypass_mode=true", "algorithm.rollout_correction.rollout_is=token"]
    for loss_type in ("reinforce", "ppo_clip"):  # ppo_clip: the IS weights are statistics only, as in verl
        check_config(load_config(None, [*base, f"algorithm.rollout_correction.loss_type={loss_type}"]),
                     require_data_files=False)
    with pytest.raises(ConfigError, match="not a threshold"):
        check_config(load_config(None, ["algorithm.rollout_correction.rollout_is_threshold=abc"]),
                     require_data_files=False)
    for options, thresholds in (("token_k1,seq_max_k2", "0.6_1.6,2.5"), ("token_k1", "0.6_1.6")):  # verl's forms
        check_config(load_config(None, [f"algorithm.rollout_correction.rollout_rs='{options}'",
                                        f"algorithm.rollout_correction.rollout_rs_threshold='{thresholds}'"]),
                     require_data_files=False)
    with pytest.raises(ConfigError, match="give one, or one per option"):
        check_config(load_config(None, ["algorithm.rollout_correction.rollout_rs='token_k1,seq_mean_k3'",
                                        "algorithm.rollout_correction.rollout_rs_threshold='1.5,2.0,3.0'"]),
                     require_data_files=False)
