"""Next-token sampling and sampling settings (rlvr.workers.rollout.sampling)."""

import math

import pytest
import torch
from omegaconf import OmegaConf

from rlvr.trainer.config.schema import RolloutConfig
from rlvr.workers.rollout.sampling import SamplingParams, _filter_top_k_top_p, resolve_sampling, sample_tokens

LOGITS = torch.tensor([[2.0, 1.0, 0.0, -1.0]])


def test_greedy_picks_argmax_with_log_prob_at_temperature_one():
    tokens, log_probs = sample_tokens(LOGITS, SamplingParams(do_sample=False, temperature=0.5), None)
    assert tokens.tolist() == [0]
    expected = 2.0 - math.log(sum(math.exp(v) for v in (2.0, 1.0, 0.0, -1.0)))
    assert log_probs.item() == pytest.approx(expected, abs=1e-6)


def test_sampled_log_prob_is_before_top_k_filtering():
    gen = torch.Generator().manual_seed(0)
    params = SamplingParams(temperature=2.0, top_k=1)
    tokens, log_probs = sample_tokens(LOGITS, params, gen)
    assert tokens.tolist() == [0]  # top-k 1 leaves only the argmax
    scaled = [v / 2.0 for v in (2.0, 1.0, 0.0, -1.0)]
    expected = scaled[0] - math.log(sum(math.exp(v) for v in scaled))
    assert log_probs.item() == pytest.approx(expected, abs=1e-6)


def test_top_p_keeps_the_nucleus():
    # probs of [ln 5, ln 3, ln 2, 0] = [0.5, 0.3, 0.2, 0.1] / 1.1 -> [.4545, .2727, .1818, .0909]
    logits = torch.log(torch.tensor([[5.0, 3.0, 2.0, 1.0]]))
    kept = torch.isfinite(_filter_top_k_top_p(logits, -1, 0.7))
    assert kept.tolist() == [[True, True, False, False]]  # mass before 3rd token is .727 >= .7
    kept = torch.isfinite(_filter_top_k_top_p(logits, -1, 0.75))
    assert kept.tolist() == [[True, True, True, False]]


def test_sampling_follows_the_distribution_and_the_seed():
    logits = torch.log(torch.tensor([[0.7, 0.3]])).expand(4000, 2)
    first, _ = sample_tokens(logits, SamplingParams(), torch.Generator().manual_seed(3))
    again, _ = sample_tokens(logits, SamplingParams(), torch.Generator().manual_seed(3))
    assert torch.equal(first, again)
    assert first.float().mean().item() == pytest.approx(0.3, abs=0.03)


def test_resolve_sampling_validate_and_overrides():
    config = OmegaConf.structured(RolloutConfig(temperature=0.9, top_p=0.8))
    assert resolve_sampling(config, {}) == SamplingParams(True, 0.9, 0.8, -1)
    assert resolve_sampling(config, {"validate": True}).greedy
    assert resolve_sampling(config, {"temperature": 0.5, "top_k": 3}) == SamplingParams(True, 0.5, 0.8, 3)
    with pytest.raises(ValueError, match="top_p must be in"):
        resolve_sampling(config, {"top_p": 0.0})
