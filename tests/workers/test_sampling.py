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


def _one_level_draw(weights: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Reference: one float64 running sum over the whole vocabulary, one uniform number per row."""
    cdf = weights.double().cumsum(dim=-1)
    target = torch.rand(weights.shape[0], 1, generator=generator, dtype=torch.float64) * cdf[:, -1:]
    return torch.searchsorted(cdf, target, right=True).squeeze(-1)


def _uniform(rows: int, seed: int) -> torch.Tensor:
    """The ``[rows, 1]`` float64 draw the engine makes (``sampling.draw_uniform``) from a seeded generator."""
    return torch.rand(rows, 1, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("vocab", [7, 256, 257, 1000, 49152, 151936])
def test_two_level_draw_equals_one_running_sum(vocab):
    from rlvr.workers.rollout.sampling import _inverse_cdf_pick

    weights = (torch.randn(64, vocab, generator=torch.Generator().manual_seed(vocab)) * 3).exp()
    drawn = _inverse_cdf_pick(weights, _uniform(64, 11))
    assert torch.equal(drawn, _one_level_draw(weights, torch.Generator().manual_seed(11)))


def test_two_level_draw_never_picks_zero_weight_tokens():
    from rlvr.workers.rollout.sampling import BLOCK, _inverse_cdf_pick

    vocab = 3 * BLOCK + 5  # a short last block
    weights = torch.zeros(2000, vocab)
    weights[:, 3] = 1.0  # first block: one token
    weights[:, 2 * BLOCK + 7] = 3.0  # second block empty, third block: one token
    weights[:, vocab - 3] = 4.0  # last (partial) block: a token followed by zeros
    drawn = _inverse_cdf_pick(weights, _uniform(2000, 0))
    assert set(drawn.tolist()) == {3, 2 * BLOCK + 7, vocab - 3}
    shares = [(drawn == t).float().mean().item() for t in (3, 2 * BLOCK + 7, vocab - 3)]
    assert shares == pytest.approx([1 / 8, 3 / 8, 4 / 8], abs=0.04)


def test_two_level_draw_at_the_top_of_the_range_takes_the_last_positive_token():
    from rlvr.workers.rollout import sampling

    weights = torch.zeros(1, 600)
    weights[0, 10], weights[0, 300] = 1.0, 2.0  # tokens past 300 (and the whole third block) weigh 0
    # u just below 1: the target sits at the very end of the running sum
    top = torch.full((1, 1), 1.0 - 1e-17, dtype=torch.float64)
    assert sampling._inverse_cdf_pick(weights, top).tolist() == [300]
