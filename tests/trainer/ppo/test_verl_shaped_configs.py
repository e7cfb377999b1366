"""Configs shaped as verl users build them (verl's keys only: no ``singleton_advantage``,
``gpg_alpha_count``, ``global_batch_info``, ``on_error`` ...) work at every verl path and give
verl's numbers: a dict, an OmegaConf node in struct mode (missing keys raise, as in verl's Hydra
configs), a dataclass of verl's fields, and a ``SimpleNamespace``. The references are the loop
implementations of ``ppo_reference_impl`` with verl's settings (a lone sample keeps its score,
GPG counts the non-zero scores), on right-padded masks of different lengths."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

import ppo_reference_impl as ref
from rlvr.trainer.ppo import core_algos as ca
from rlvr.utils.config_view import config_view

INDEX = np.array(["a", "a", "a", "b", "b", "c", "d", "d"], dtype=object)  # groups of 3, 2, 1 and 2
LENGTHS = [5, 3, 4, 2, 5, 1, 4, 4]
GAMMA, LAM = 0.9, 0.8


@dataclass
class VerlKLControl:
    type: str = "fixed"
    kl_coef: float = 0.001
    horizon: int = 10000
    target_kl: float = 0.1


@dataclass
class VerlAlgoConfig:
    """The fields of verl 0.9's ``AlgoConfig`` that the estimators can see (none of rlvr's own)."""

    gamma: float = GAMMA
    lam: float = LAM
    adv_estimator: str = "gae"
    norm_adv_by_std_in_grpo: bool = True
    use_kl_in_reward: bool = False
    kl_penalty: str = "kl"
    kl_ctrl: VerlKLControl = field(default_factory=VerlKLControl)


def _verl_algo_configs() -> dict[str, object]:
    plain = {"gamma": GAMMA, "lam": LAM, "adv_estimator": "gae", "norm_adv_by_std_in_grpo": True,
             "use_kl_in_reward": False, "kl_penalty": "kl",
             "kl_ctrl": {"type": "fixed", "kl_coef": 0.001, "horizon": 10000, "target_kl": 0.1}}
    node = OmegaConf.create(plain)
    OmegaConf.set_struct(node, True)
    return {"dict": plain, "omegaconf": node, "dataclass": VerlAlgoConfig(),
            "namespace": SimpleNamespace(**{k: v for k, v in plain.items() if k != "kl_ctrl"})}


VERL_CONFIGS = _verl_algo_configs()


def _batch():
    gen = torch.Generator().manual_seed(3)
    mask = torch.zeros(len(LENGTHS), max(LENGTHS))
    for row, length in enumerate(LENGTHS):
        mask[row, :length] = 1
    scores = torch.rand(len(LENGTHS), generator=gen) * 2 - 0.5
    scores[2] = 0.0  # a zero score: GPG's alpha counts the non-zero ones
    rewards = torch.zeros_like(mask)
    rewards[torch.arange(len(LENGTHS)), torch.tensor(LENGTHS) - 1] = scores
    token_rewards = rewards + 0.1 * torch.rand(mask.shape, generator=gen) * mask  # dense rewards for GAE / REINFORCE++
    values = torch.randn(mask.shape, generator=gen)
    baselines = torch.rand(len(LENGTHS), generator=gen)
    return rewards, token_rewards, mask, values, baselines


def _references(rewards, token_rewards, mask, values, baselines) -> dict[str, list]:
    """verl's numbers per estimator (its advantages), from the loop implementations."""
    r, tr, m, v = (t.double().tolist() for t in (rewards, token_rewards, mask, values))
    idx = list(INDEX)
    return {
        "gae": ref.gae(tr, v, m, GAMMA, LAM)[0],
        "grpo": ref.grpo(r, m, idx),
        "grpo_vectorized": ref.grpo(r, m, idx),
        "rloo": ref.rloo(r, m, idx),
        "rloo_vectorized": ref.rloo(r, m, idx, singleton="zero"),  # verl's vectorized RLOO gives a lone sample 0
        "opo": ref.opo(r, m, idx),
        "gpg": ref.gpg(r, m, idx),
        "reinforce_plus_plus": ref.reinforce_pp(tr, m, GAMMA)[0],
        "reinforce_plus_plus_baseline": ref.reinforce_pp_baseline(r, m, idx),
        "remax": ref.remax(r, m, baselines.double().tolist())[0],
    }


@pytest.mark.parametrize("kind", list(VERL_CONFIGS))
def test_every_verl_estimator_gives_verls_numbers_with_a_verl_config(kind):
    """The registry calling convention (every input by keyword, ``config`` = the algorithm
    section) with a config that has only verl's keys: no AttributeError for rlvr's options,
    and verl's numbers."""
    rewards, token_rewards, mask, values, baselines = _batch()
    expected = _references(rewards, token_rewards, mask, values, baselines)
    dense = {"gae", "reinforce_plus_plus"}
    for name, reference in expected.items():
        advantages, _ = ca.get_adv_estimator_fn(name)(
            token_level_rewards=token_rewards if name in dense else rewards, response_mask=mask, index=INDEX,
            values=values, reward_baselines=baselines, config=VERL_CONFIGS[kind])
        torch.testing.assert_close(advantages.double(), torch.tensor(reference, dtype=torch.float64),
                                   rtol=1e-5, atol=1e-5, msg=f"{name} with a verl {kind} config")


@pytest.mark.parametrize("kind", list(VERL_CONFIGS))
def test_egpo_reads_its_own_options_with_rlvrs_defaults(kind):
    """EGPO is rlvr's; a verl config lacks its knobs, which then take the schema's defaults."""
    rewards, _, mask, _, _ = _batch()
    log_prob = -torch.rand(mask.shape, generator=torch.Generator().manual_seed(5))
    with_verl, _ = ca.compute_egpo_outcome_advantage(rewards, mask, INDEX, log_prob, config=VERL_CONFIGS[kind])
    with_defaults, _ = ca.compute_egpo_outcome_advantage(rewards, mask, INDEX, log_prob, config=None)
    r, m, lp = (t.double().tolist() for t in (rewards, mask, log_prob))
    reference = ref.egpo(r, m, list(INDEX), lp, 0.5, 0.1, 0.5)
    torch.testing.assert_close(with_verl, with_defaults)
    torch.testing.assert_close(with_verl.double(), torch.tensor(reference, dtype=torch.float64), rtol=1e-5, atol=1e-5)


def test_a_verl_config_with_rlvrs_options_uses_them():
    """A key the config does have wins over the default: the view is not a fallback for everything."""
    rewards, _, mask, _, _ = _batch()
    node = OmegaConf.create({"norm_adv_by_std_in_grpo": True, "singleton_advantage": "zero"})
    advantages, _ = ca.compute_grpo_outcome_advantage(rewards, mask, INDEX, config=node)
    reference = ref.grpo(rewards.double().tolist(), mask.double().tolist(), list(INDEX), singleton="zero")
    torch.testing.assert_close(advantages.double(), torch.tensor(reference, dtype=torch.float64), rtol=1e-5, atol=1e-5)
    assert advantages[5].abs().sum() == 0  # row 5 is alone in its group


def _loss_inputs():
    gen = torch.Generator().manual_seed(11)
    mask = torch.ones(3, 4)
    mask[1, 3:] = 0
    old = -torch.rand(3, 4, generator=gen) * 2
    new = old + (torch.rand(3, 4, generator=gen) - 0.5) * 0.8
    adv = torch.randn(3, 4, generator=gen)
    return old, new, adv, mask


VERL_ACTOR = {"clip_ratio": 0.2, "clip_ratio_low": 0.1, "clip_ratio_high": 0.3, "clip_ratio_c": 3.0,
              "loss_agg_mode": "token-mean", "policy_loss": {"loss_mode": "vanilla"}}


@pytest.mark.parametrize("make", [dict, lambda d: OmegaConf.create(d),
                                  lambda d: SimpleNamespace(**{**d, "policy_loss": SimpleNamespace(**d["policy_loss"])})],
                         ids=["dict", "omegaconf", "namespace"])
def test_vanilla_loss_with_a_verl_actor_config_gives_the_dual_clip_number(make):
    """``compute_policy_loss_vanilla`` with verl's actor keys only (no ``global_batch_info``): the
    dual-clip PPO loss of the reference loop with verl's clip ratios."""
    old, new, adv, mask = _loss_inputs()
    loss, _ = ca.compute_policy_loss_vanilla(old, new, adv, mask, "token-mean", make(VERL_ACTOR))
    o, n, a, m = (t.double().tolist() for t in (old, new, adv, mask))
    assert loss.item() == pytest.approx(ref.ppo_loss(o, n, a, m, 0.1, 0.3, 3.0, "token-mean")[0], rel=1e-5)


def test_every_registered_loss_runs_on_a_verl_actor_config():
    """verl's cispo test passes a ``SimpleNamespace`` with only the clip ratios and a
    ``policy_loss`` namespace: every loss reads its other options with rlvr's defaults and gives
    the number it gives with the schema's actor section of the same clip ratios (DRO's required
    ``dro_beta`` given in both; bypass mode, whose section only verl's trainer fills, without any
    correction is the vanilla loss)."""
    from rlvr.trainer.config import ActorConfig, PolicyLossConfig

    old, new, adv, mask = _loss_inputs()
    verl = SimpleNamespace(clip_ratio=0.2, clip_ratio_low=None, clip_ratio_high=None,
                           policy_loss=SimpleNamespace(cispo_clip_ratio_high=0.2, cispo_clip_ratio_low=0.2, dro_beta=0.1,
                                                       rollout_correction=SimpleNamespace()))
    for name in ca.POLICY_LOSS_REGISTRY.names():
        torch.manual_seed(0)  # clip_cov picks its tokens at random
        loss, _ = ca.get_policy_loss_fn(name)(old, new, adv, mask, "token-mean", verl)
        torch.manual_seed(0)
        expected, _ = ca.get_policy_loss_fn("vanilla" if name == "bypass_mode" else name)(
            old, new, adv, mask, "token-mean", ActorConfig(policy_loss=PolicyLossConfig(dro_beta=0.1)))
        assert torch.isfinite(loss) and loss.item() == pytest.approx(expected.item(), rel=1e-6), name


def test_config_view_reads_defaults_passes_other_keys_and_keeps_typed_configs():
    from rlvr.trainer.config import ActorConfig, AlgorithmConfig

    view = config_view({"gamma": 0.5, "extra": 1}, AlgorithmConfig)
    assert view.gamma == 0.5 and view.singleton_advantage is None and view.gpg_alpha_count == "nonzero_score"
    assert view.extra == 1 and view.kl_ctrl.type == "fixed" and view.get("missing", 7) == 7
    assert "gamma" in view and "egpo_beta" in view and "missing" not in view
    with pytest.raises(AttributeError, match="AlgorithmConfig has no field 'missing'"):
        view.missing
    typed = OmegaConf.structured(ActorConfig)
    assert config_view(typed, ActorConfig) is typed  # a typed config has every field: no view
    actor = ActorConfig()
    assert config_view(actor, ActorConfig) is actor
    assert config_view(None, ActorConfig).global_batch_info == {}
