"""agg_loss, compute_policy_loss and the policy-loss registry: hand-computed values and agreement
with the independent loop implementation in ppo_reference_impl (1e-6, float32). The losses take
the actor config section (the schema's ``ActorConfig``)."""

from __future__ import annotations

import math

import pytest
import torch

import ppo_reference_impl as ref
from ppo_test_data import as_lists, make_log_probs, make_mask
from rlvr.trainer.config import ActorConfig, PolicyLossConfig
from rlvr.trainer.ppo.policy_loss import (
    AGG_LOSS_MODES,
    POLICY_LOSS_REGISTRY,
    agg_loss,
    compute_policy_loss,
    get_policy_loss_fn,
    register_policy_loss,
)

METRIC_KEYS = {"pg_loss", "pg_clipfrac", "ppo_kl", "pg_clipfrac_lower"}


def _random_policy_batch(seed: int):
    gen = torch.Generator().manual_seed(seed)
    mask = make_mask(empty_row=True)
    old = make_log_probs(gen)
    new = old + 0.4 * torch.randn(old.shape, generator=gen)
    adv = torch.randn(old.shape, generator=gen)
    return old, new, adv, mask


def _close(actual: torch.Tensor, expected: float) -> None:
    assert actual.dtype == torch.float32
    assert math.isclose(actual.item(), expected, rel_tol=1e-6, abs_tol=1e-6), (actual.item(), expected)


# ------------------------------------------------------------------------------------------ agg_loss
def test_agg_loss_hand_computed():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])  # last row fully masked
    _close(agg_loss(loss, mask, "token-mean"), 7 / 3)
    _close(agg_loss(loss, mask, "seq-mean-token-sum"), (3 + 4) / 2)
    _close(agg_loss(loss, mask, "seq-mean-token-mean"), (1.5 + 4) / 2)
    _close(agg_loss(loss, mask, "seq-mean-token-sum-norm"), (3 / 3 + 4 / 3) / 2)
    _close(agg_loss(loss, mask, "token-sum"), 7)
    _close(agg_loss(loss, mask, "seq-mean-token-sum-norm", loss_scale_factor=10), (3 / 10 + 4 / 10) / 2)


@pytest.mark.parametrize("mode", AGG_LOSS_MODES)
def test_agg_loss_all_masked_is_zero_not_nan(mode):
    loss = torch.full((2, 3), 5.0, requires_grad=True)
    out = agg_loss(loss, torch.zeros(2, 3), mode)
    assert out.item() == 0.0
    out.backward()
    assert torch.equal(loss.grad, torch.zeros(2, 3))


@pytest.mark.parametrize("mode", AGG_LOSS_MODES)
def test_agg_loss_ignores_nan_on_masked_positions(mode):
    loss = torch.tensor([[2.0, float("nan")], [float("inf"), 4.0]], requires_grad=True)
    out = agg_loss(loss, torch.tensor([[1, 0], [0, 1]]), mode)
    assert torch.isfinite(out)
    out.backward()
    assert torch.isfinite(loss.grad).all()


@pytest.mark.parametrize("mode", AGG_LOSS_MODES)
def test_agg_loss_matches_reference(mode):
    gen = torch.Generator().manual_seed(1)
    loss, mask = torch.randn(8, 7, generator=gen), make_mask(empty_row=True)
    _close(agg_loss(loss, mask, mode), ref.agg_loss(*as_lists(loss, mask), mode))


def test_agg_loss_bf16_computes_in_float32():
    loss = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.bfloat16)
    _close(agg_loss(loss, torch.ones(2, 2), "seq-mean-token-mean"), 2.5)


def test_agg_loss_unknown_mode_lists_valid_modes():
    with pytest.raises(ValueError, match="seq-mean-token-sum-norm"):
        agg_loss(torch.ones(1, 2), torch.ones(1, 2), "sample-mean")


# ------------------------------------------------------------------------------- compute_policy_loss
def test_compute_policy_loss_hand_computed():
    # token 0: A=1, r=1.5 -> clipped at 1.2: loss -1.2 (clipped)
    # token 1: A=-1, r=0.5 -> clipped at 0.8: loss 0.8 (clipped)
    # token 2: A=-1, r=5 -> PPO loss 5, dual-clip bound 3: loss 3 (lower-clipped)
    # token 3: A=2, r=1: loss -2; token 4 is masked
    ratio = torch.tensor([[1.5, 0.5, 5.0, 1.0, 7.0]])
    old = torch.full((1, 5), -1.0)
    new = old + ratio.log()
    adv = torch.tensor([[1.0, -1.0, -1.0, 2.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    pg_loss, clipfrac, ppo_kl, clipfrac_lower = compute_policy_loss(old, new, adv, mask, cliprange=0.2)
    _close(pg_loss, (-1.2 + 0.8 + 3.0 - 2.0) / 4)
    _close(clipfrac, 2 / 4)
    _close(clipfrac_lower, 1 / 4)
    _close(ppo_kl, -math.log(1.5 * 0.5 * 5.0) / 4)


def test_compute_policy_loss_asymmetric_clip():
    old, new = torch.zeros(1, 2), torch.log(torch.tensor([[1.25, 1.25]]))
    adv = torch.ones(1, 2)
    pg_loss, clipfrac, _, _ = compute_policy_loss(old, new, adv, torch.ones(1, 2), cliprange=0.2,
                                                  cliprange_low=0.2, cliprange_high=0.28)
    _close(pg_loss, -1.25)  # 1.25 < 1 + 0.28: not clipped
    _close(clipfrac, 0.0)


@pytest.mark.parametrize("mode", AGG_LOSS_MODES)
def test_compute_policy_loss_matches_reference(mode):
    old, new, adv, mask = _random_policy_batch(2)
    got = compute_policy_loss(old, new, adv, mask, cliprange=0.2, cliprange_high=0.28, clip_ratio_c=2.5,
                              loss_agg_mode=mode)
    expected = ref.ppo_loss(*as_lists(old, new, adv, mask), 0.2, 0.28, 2.5, mode)
    for actual, exp in zip(got, expected):
        _close(actual, exp)


def test_compute_policy_loss_rejects_bad_clip_settings():
    x = torch.zeros(1, 2)
    for error in (ValueError, AssertionError):  # verl asserts
        with pytest.raises(error, match="clip_ratio_c.*must be > 1"):
            compute_policy_loss(x, x, x, x + 1, cliprange=0.2, clip_ratio_c=1.0)
    with pytest.raises(ValueError, match="cliprange"):
        compute_policy_loss(x, x, x, x + 1)


def test_compute_policy_loss_clamps_log_ratio():
    old = torch.tensor([[-100.0, -100.0]])
    new = torch.zeros(1, 2, requires_grad=True)  # log-ratio 100 -> clamped to 20
    pg_loss, *_ = compute_policy_loss(old, new, torch.tensor([[-1.0, 1.0]]), torch.ones(1, 2), cliprange=0.2)
    pg_loss.backward()
    _close(pg_loss, (3.0 - 1.2) / 2)  # dual-clip bound 3 and the upper clip 1.2
    assert torch.isfinite(new.grad).all()


def test_compute_policy_loss_bf16_inputs():
    old, new, adv, mask = _random_policy_batch(3)
    bf = [t.to(torch.bfloat16) for t in (old, new, adv)]
    got = compute_policy_loss(*bf, mask, cliprange=0.2)
    expected = compute_policy_loss(*[t.float() for t in bf], mask, cliprange=0.2)
    for actual, exp in zip(got, expected):
        assert actual.dtype == torch.float32
        torch.testing.assert_close(actual, exp)


# ---------------------------------------------------------------------------------------- registry
def test_registry_names_duplicates_and_misses():
    for name in ("vanilla", "gspo", "gpg", "cispo", "clip_cov", "kl_cov", "geo_mean"):
        assert callable(get_policy_loss_fn(name))
    with pytest.raises(ValueError, match="already registered"):
        register_policy_loss("vanilla")(lambda *a, **k: None)
    for error in (KeyError, ValueError):  # a dict miss, and what verl's get_policy_loss_fn raises
        with pytest.raises(error, match="geo_mean.*gspo"):
            get_policy_loss_fn("ppo")


def test_registry_is_a_dict_that_survives_clear_and_update():
    saved = dict(POLICY_LOSS_REGISTRY)
    try:
        assert isinstance(POLICY_LOSS_REGISTRY, dict) and "vanilla" in POLICY_LOSS_REGISTRY
        assert POLICY_LOSS_REGISTRY["vanilla"] is get_policy_loss_fn("vanilla")
        POLICY_LOSS_REGISTRY.clear()
        with pytest.raises(KeyError, match=r"valid names: \(none registered\)"):
            get_policy_loss_fn("vanilla")
        POLICY_LOSS_REGISTRY.update({"plain": saved["gpg"]})
        assert get_policy_loss_fn("plain") is saved["gpg"]
        register_policy_loss("vanilla")(saved["vanilla"])  # re-registering after a clear works
        assert sorted(POLICY_LOSS_REGISTRY) == ["plain", "vanilla"]
    finally:
        POLICY_LOSS_REGISTRY.clear()
        POLICY_LOSS_REGISTRY.update(saved)


@pytest.mark.parametrize("name", ["vanilla", "gspo", "gpg", "cispo", "clip_cov", "kl_cov", "geo_mean"])
def test_registry_convention_and_bf16(name):
    old, new, adv, mask = _random_policy_batch(4)
    new = new.to(torch.bfloat16).requires_grad_(True)
    loss, metrics = get_policy_loss_fn(name)(old.to(torch.bfloat16), new, adv.to(torch.bfloat16), mask,
                                             "token-mean", None, None)  # verl's positional order
    assert loss.dtype == torch.float32 and loss.dim() == 0
    assert set(metrics) == METRIC_KEYS
    assert all(v.dim() == 0 and not v.requires_grad and torch.isfinite(v) for v in metrics.values())
    loss.backward()
    assert torch.isfinite(new.grad.float()).all()
    assert torch.equal(new.grad[3], torch.zeros_like(new.grad[3]))  # fully masked row gets no gradient


@pytest.mark.parametrize("mode", AGG_LOSS_MODES)
def test_vanilla_matches_reference(mode):
    old, new, adv, mask = _random_policy_batch(5)
    config = ActorConfig(clip_ratio=0.2, clip_ratio_high=0.3, clip_ratio_c=2.0)
    loss, metrics = get_policy_loss_fn("vanilla")(old, new, adv, mask, loss_agg_mode=mode, config=config)
    expected = ref.ppo_loss(*as_lists(old, new, adv, mask), 0.2, 0.3, 2.0, mode)
    for actual, exp in zip([loss, metrics["pg_clipfrac"], metrics["ppo_kl"], metrics["pg_clipfrac_lower"]], expected):
        _close(actual, exp)


@pytest.mark.parametrize("mode", AGG_LOSS_MODES)
def test_gspo_matches_reference(mode):
    old, new, adv, mask = _random_policy_batch(6)
    new = old + 0.05 * (new - old)  # sequence ratios near 1 so some are inside the clip range
    config = ActorConfig(clip_ratio_low=0.01, clip_ratio_high=0.02)
    loss, metrics = get_policy_loss_fn("gspo")(old, new, adv, mask, loss_agg_mode=mode, config=config)
    exp_loss, exp_clipfrac = ref.gspo(*as_lists(old, new, adv, mask), 0.01, 0.02, mode)
    _close(loss, exp_loss)
    _close(metrics["pg_clipfrac"], exp_clipfrac)


def test_gspo_gradient_is_sequence_ratio_times_token_gradient():
    old = torch.zeros(1, 2)
    new = torch.tensor([[math.log(2.0), 0.0]], requires_grad=True)
    config = ActorConfig(clip_ratio=10.0)
    loss, _ = get_policy_loss_fn("gspo")(old, new, torch.ones(1, 2), torch.ones(1, 2),
                                         loss_agg_mode="seq-mean-token-mean", config=config)
    loss.backward()
    _close(loss, -math.sqrt(2.0))  # s = exp((ln 2 + 0) / 2)
    torch.testing.assert_close(new.grad, torch.full((1, 2), -math.sqrt(2.0) / 2))


@pytest.mark.parametrize("mode", AGG_LOSS_MODES)
def test_gpg_and_cispo_match_reference(mode):
    old, new, adv, mask = _random_policy_batch(7)
    config = ActorConfig(clip_ratio_low=0.3, clip_ratio_high=0.2)
    loss, _ = get_policy_loss_fn("gpg")(old, new, adv, mask, loss_agg_mode=mode)
    _close(loss, ref.gpg_loss(*as_lists(new, adv, mask), mode))
    loss, _ = get_policy_loss_fn("cispo")(old, new, adv, mask, loss_agg_mode=mode, config=config)
    _close(loss, ref.cispo(*as_lists(old, new, adv, mask), 0.3, 0.2, mode))


def test_cispo_hand_computed_gradient():
    old = torch.zeros(1, 2)
    new = torch.tensor([[math.log(2.0), math.log(0.5)]], requires_grad=True)
    loss, metrics = get_policy_loss_fn("cispo")(old, new, torch.ones(1, 2), torch.ones(1, 2),
                                                config=ActorConfig(clip_ratio_low=1.0, clip_ratio_high=0.2))
    loss.backward()
    # weights: r=2 clipped to 1.2 (upper); r=0.5 kept (no lower bound with clip_ratio_low=1)
    _close(loss, (-1.2 * math.log(2.0) - 0.5 * math.log(0.5)) / 2)
    torch.testing.assert_close(new.grad, torch.tensor([[-0.6, -0.25]]))
    _close(metrics["pg_clipfrac"], 0.5)
    _close(metrics["pg_clipfrac_lower"], 0.0)


def test_gpg_hand_computed():
    log_prob = torch.tensor([[-1.0, -2.0, -5.0]])
    loss, metrics = get_policy_loss_fn("gpg")(log_prob, log_prob, torch.tensor([[2.0, -1.0, 9.0]]),
                                              torch.tensor([[1.0, 1.0, 0.0]]))
    _close(loss, (2.0 - 2.0) / 2)
    _close(metrics["ppo_kl"], 0.0)


def test_kl_cov_hand_computed():
    # covariances (A - 0.5)(logp + 0.875): token (0,0) -> 0.5625, the others 0.0625: k = 1 -> (0,0)
    adv = torch.tensor([[2.0, 0.0], [0.0, 0.0]])
    new = torch.tensor([[-0.5, -1.0], [-1.0, -1.0]])
    config = ActorConfig(policy_loss=PolicyLossConfig(kl_cov_ratio=0.25, ppo_kl_coef=1.0))
    loss, metrics = get_policy_loss_fn("kl_cov")(new - 0.1, new, adv, torch.ones(2, 2), config=config)
    _close(loss, (-2.0 * math.exp(0.1) + 0.1) / 4)
    _close(metrics["pg_clipfrac"], 0.25)


@pytest.mark.parametrize("mode", AGG_LOSS_MODES)
def test_kl_cov_matches_reference(mode):
    old, new, adv, mask = _random_policy_batch(8)
    config = ActorConfig(policy_loss=PolicyLossConfig(kl_cov_ratio=0.1, ppo_kl_coef=0.7))
    loss, metrics = get_policy_loss_fn("kl_cov")(old, new, adv, mask, loss_agg_mode=mode, config=config)
    exp_loss, top = ref.kl_cov(*as_lists(old, new, adv, mask), 0.1, 0.7, mode)
    _close(loss, exp_loss)
    _close(metrics["pg_clipfrac"], len(top) / mask.sum().item())


def test_clip_cov_hand_computed_cuts_the_selected_token():
    adv = torch.tensor([[2.0, 0.0], [0.0, 0.0]])
    new = torch.tensor([[-0.5, -1.0], [-1.0, -1.0]], requires_grad=True)
    old = new.detach().clone()
    config = ActorConfig(policy_loss=PolicyLossConfig(clip_cov_ratio=0.25, clip_cov_lb=0.5, clip_cov_ub=1.0))
    loss, metrics = get_policy_loss_fn("clip_cov")(old, new, adv, torch.ones(2, 2), config=config)
    loss.backward()
    _close(loss, 0.0)  # the only candidate (cov 0.5625 in (0.5, 1)) is cut: value 0, as verl
    assert new.grad[0, 0].item() == 0.0
    _close(metrics["pg_clipfrac"], 0.25)


@pytest.mark.parametrize("mode", AGG_LOSS_MODES)
def test_clip_cov_matches_reference(mode):
    old, new, adv, mask = _random_policy_batch(9)
    config = ActorConfig(clip_ratio=0.2, policy_loss=PolicyLossConfig(clip_cov_ratio=0.1, clip_cov_lb=0.0,
                                                                       clip_cov_ub=2.0))
    new = new.clone().requires_grad_(True)
    torch.manual_seed(123)
    loss, metrics = get_policy_loss_fn("clip_cov")(old, new, adv, mask, loss_agg_mode=mode, config=config)
    torch.manual_seed(123)
    exp_loss, chosen = ref.clip_cov(*as_lists(old, new.detach(), adv, mask), 0.2, 0.2, 0.1, 0.0, 2.0, mode,
                                    permutation=lambda n: torch.randperm(n).tolist())
    _close(loss, exp_loss)
    assert len(chosen) == 3  # int(0.1 * 35 valid tokens), enough candidates in (0, 2)
    _close(metrics["pg_clipfrac"], len(chosen) / mask.sum().item())
    loss.backward()
    assert all(new.grad[i, t].item() == 0.0 for i, t in chosen)


def test_geo_mean_hand_computed():
    old = torch.zeros(2, 2)
    new = torch.tensor([[0.6, -0.2], [0.6, -0.2]])
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    loss, metrics = get_policy_loss_fn("geo_mean")(old, new, adv, torch.ones(2, 2),
                                                   loss_agg_mode="seq-mean-token-mean", config=ActorConfig(clip_ratio=0.4))
    # A > 0: min(lr, clip(lr)) = [0.4, -0.2] -> -exp(0.1); A < 0: max = [0.6, -0.2] -> +exp(0.2)
    _close(loss, (-math.exp(0.1) + math.exp(0.2)) / 2)
    _close(metrics["pg_clipfrac"], 0.25)
    _close(metrics["pg_clipfrac_lower"], 0.25)


@pytest.mark.parametrize("mode", AGG_LOSS_MODES)
def test_geo_mean_matches_reference(mode):
    old, new, adv, mask = _random_policy_batch(10)
    config = ActorConfig(clip_ratio_low=0.3, clip_ratio_high=0.5)
    loss, _ = get_policy_loss_fn("geo_mean")(old, new, adv, mask, loss_agg_mode=mode, config=config)
    _close(loss, ref.geo_mean(*as_lists(old, new, adv, mask), 0.3, 0.5, mode))


@pytest.mark.parametrize("name", ["vanilla", "gspo", "gpg", "cispo", "clip_cov", "kl_cov", "geo_mean"])
@pytest.mark.parametrize("mode", AGG_LOSS_MODES)
def test_rollout_is_weights_scale_every_loss(name, mode):
    """``rollout_is_weights`` multiplies the per-token losses: all-ones weights change nothing,
    a constant weight c scales the loss by c (per-token weights: test_rollout_correction.py)."""
    old, new, adv, mask = _random_policy_batch(6)
    fn = get_policy_loss_fn(name)
    losses = []
    for weights in (None, torch.ones_like(old), torch.full_like(old, 2.5)):
        torch.manual_seed(0)  # clip_cov draws its detached tokens at random
        losses.append(fn(old, new, adv, mask, loss_agg_mode=mode, rollout_is_weights=weights)[0])
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-6, atol=1e-6)
    # token-sum adds the weighted terms in another order: float32 rounding of about 1e-6
    torch.testing.assert_close(losses[2], 2.5 * losses[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["vanilla", "gspo", "gpg", "cispo", "kl_cov", "geo_mean"])
def test_rollout_is_weights_scale_the_per_token_losses(name):
    old, new, adv, mask = _random_policy_batch(11)
    weights = torch.rand(old.shape, generator=torch.Generator().manual_seed(0)) + 0.5
    config = ActorConfig(clip_ratio_low=0.3, clip_ratio_high=0.5)
    plain, _ = get_policy_loss_fn(name)(old, new, adv, mask, "seq-mean-token-sum", config)
    weighted, _ = get_policy_loss_fn(name)(old, new, adv, mask, "seq-mean-token-sum", config, weights)
    ones, _ = get_policy_loss_fn(name)(old, new, adv, mask, "seq-mean-token-sum", config, torch.ones_like(old))
    torch.testing.assert_close(ones, plain)
    assert not torch.isclose(weighted, plain)


def test_rollout_is_weights_hand_computed():
    old = new = torch.zeros(1, 2)
    weights = torch.tensor([[2.0, 0.5]])
    loss, _ = get_policy_loss_fn("vanilla")(old, new, torch.ones(1, 2), torch.ones(1, 2), "token-mean", None, weights)
    _close(loss, (-2.0 - 0.5) / 2)
    # geo_mean weighs the sequence by the geometric mean of its weights: sqrt(2 * 0.5) = 1
    loss, _ = get_policy_loss_fn("geo_mean")(old, new, torch.ones(1, 2), torch.ones(1, 2), "token-mean", None, weights)
    _close(loss, -1.0)


def test_cov_losses_reject_a_non_positive_ratio():
    x = torch.zeros(1, 2)
    for name, field in [("clip_cov", "clip_cov_ratio"), ("kl_cov", "kl_cov_ratio")]:
        config = ActorConfig(policy_loss=PolicyLossConfig(**{field: 0.0}))
        for error in (ValueError, AssertionError):  # verl asserts
            with pytest.raises(error, match=f"policy_loss.{field}.*must be > 0"):
                get_policy_loss_fn(name)(x, x, x, x + 1, config=config)
