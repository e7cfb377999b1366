"""The fused decode step (model step + sampling in one function) and the sparse stop check give the
same tokens, log-probs and generator state as the plain loop."""

from __future__ import annotations

import time

import pytest
import torch
from omegaconf import OmegaConf

from rlvr.protocol import DataProto
from rlvr.trainer.config.schema import RolloutConfig
from rlvr.utils.testing import tiny_causal_lm
from rlvr.utils.torch_functional import compute_position_ids
from rlvr.workers.rollout import HFRollout, hf_rollout
from rlvr.workers.rollout.sampling import SamplingParams, draw_uniform, sample_tokens, sample_with_uniform
from rlvr.workers.rollout.static_decode import DynamicCacheDecoder, StaticCacheDecoder

TEXTS = ["1+1=", "hello there, how are", "abc", "the cat sat on"]
PARAMS = {
    "greedy": SamplingParams(do_sample=False),
    "plain": SamplingParams(temperature=0.9),
    "top_k_top_p": SamplingParams(temperature=0.7, top_k=20, top_p=0.8),
}


@pytest.fixture(scope="module")
def model_and_tokenizer():
    return tiny_causal_lm(hidden_size=64, num_hidden_layers=2, seed=3)  # float32


def left_padded(tokenizer, texts: list[str]) -> dict[str, torch.Tensor]:
    enc = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left")
    mask = enc["attention_mask"]
    return {"input_ids": enc["input_ids"], "attention_mask": mask, "position_ids": compute_position_ids(mask)}


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_sample_with_drawn_uniforms_equals_sample_tokens(name):
    params = PARAMS[name]
    logits = torch.randn(16, 1000, generator=torch.Generator().manual_seed(1)) * 4
    gen_a, gen_b = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    want = sample_tokens(logits, params, gen_a)
    uniform = draw_uniform(16, params, gen_b, "cpu")
    assert (uniform is None) == params.greedy
    got = sample_with_uniform(logits, params, uniform)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert torch.equal(gen_a.get_state(), gen_b.get_state())  # greedy draws nothing, sampling one [16, 1]


def test_sampling_without_its_uniforms_is_refused():
    with pytest.raises(ValueError, match="needs the uniform numbers"):
        sample_with_uniform(torch.zeros(2, 5), PARAMS["plain"], None)


@torch.no_grad()
def unfused_loop(decoder, batch, params: SamplingParams, steps: int, seed: int):
    """Reference: the loop before fusion, ``step`` then ``sample_tokens`` with the generator."""
    gen = torch.Generator().manual_seed(seed)
    logits = decoder.prefill(batch["input_ids"], batch["attention_mask"], batch["position_ids"])
    next_pos = batch["position_ids"][:, -1] + 1
    tokens, log_probs = sample_tokens(logits, params, gen)
    out = [(tokens, log_probs)]
    for step in range(steps):
        tokens, log_probs = sample_tokens(decoder.step(tokens, next_pos + step), params, gen)
        out.append((tokens, log_probs))
    decoder.finish()
    return out


@torch.no_grad()
def fused_loop(decoder, batch, params: SamplingParams, steps: int, seed: int):
    """The loop of ``HFRollout``: the first token eagerly, then one ``sample_step`` per token."""
    gen = torch.Generator().manual_seed(seed)
    logits = decoder.prefill(batch["input_ids"], batch["attention_mask"], batch["position_ids"])
    next_pos = batch["position_ids"][:, -1] + 1
    tokens, log_probs = sample_tokens(logits, params, gen)
    out = [(tokens, log_probs)]
    for step in range(steps):
        uniform = draw_uniform(tokens.shape[0], params, gen, tokens.device)
        tokens, log_probs = decoder.sample_step(tokens, next_pos + step, params, uniform)
        out.append((tokens, log_probs))
    decoder.finish()
    return out


@pytest.mark.parametrize("name", sorted(PARAMS))
@pytest.mark.parametrize("static", [True, False], ids=["static", "dynamic"])
def test_fused_step_run_eagerly_equals_the_unfused_loop(model_and_tokenizer, name, static):
    model, tokenizer = model_and_tokenizer
    batch = left_padded(tokenizer, TEXTS)

    def decoder():
        if static:
            return StaticCacheDecoder(model, max_cache_len=batch["input_ids"].shape[1] + 12, compile=False)
        return DynamicCacheDecoder(model)

    want = unfused_loop(decoder(), batch, PARAMS[name], steps=10, seed=4)
    got = fused_loop(decoder(), batch, PARAMS[name], steps=10, seed=4)
    assert len(got) == 11
    for (t_want, lp_want), (t_got, lp_got) in zip(want, got, strict=True):
        assert torch.equal(t_got, t_want)
        assert torch.equal(lp_got, lp_want)
    if name != "greedy":  # the tokens really vary with the draws
        assert len({tuple(t.tolist()) for t, _ in got}) > 1


@pytest.mark.slow
@pytest.mark.parametrize("name", ["greedy", "top_k_top_p"])
def test_compiled_fused_step_matches_the_eager_static_path(model_and_tokenizer, name):
    model, tokenizer = model_and_tokenizer
    batch = left_padded(tokenizer, TEXTS)
    width = batch["input_ids"].shape[1] + 9
    want = fused_loop(StaticCacheDecoder(model, max_cache_len=width, compile=False), batch, PARAMS[name], 8, seed=2)
    start = time.perf_counter()
    got = fused_loop(StaticCacheDecoder(model, max_cache_len=width, compile=True), batch, PARAMS[name], 8, seed=2)
    print(f"compiled fused loop: {time.perf_counter() - start:.1f} s with compilation")
    for (t_want, lp_want), (t_got, lp_got) in zip(want, got, strict=True):
        assert torch.equal(t_got, t_want)
        torch.testing.assert_close(lp_got, lp_want, rtol=1e-4, atol=1e-5)


def rollout(model, tokenizer, **overrides) -> HFRollout:
    values = {"response_length": 24, "prompt_length": 32, "micro_batch_size": 8, **overrides}
    return HFRollout(OmegaConf.structured(RolloutConfig(**values)), model, tokenizer, "cpu", seed=5,
                     owns_module=False)


def count_steps(engine: HFRollout) -> list[int]:
    """Wrap the engine's ``sample_step``; the returned list gets the step count of every call."""
    counts, inner = [0], engine.decoder.sample_step

    def counted(*args, **kwargs):
        counts[-1] += 1
        return inner(*args, **kwargs)

    engine.decoder.sample_step = counted
    return counts


@pytest.mark.parametrize("meta", [{}, {"validate": True}], ids=["sampled", "greedy"])
@pytest.mark.parametrize("static", [True, False], ids=["static", "dynamic"])
def test_stop_check_every_4_steps_gives_the_every_step_results(model_and_tokenizer, monkeypatch, meta, static):
    model, tokenizer = model_and_tokenizer
    texts = TEXTS * 2
    batch = left_padded(tokenizer, texts)
    if meta:  # greedy repeats itself: its EOS ids are the tokens the greedy rows emit at column 9
        pilot = rollout(model, tokenizer, ignore_eos=True).generate_sequences(DataProto.from_dict(batch, meta_info=meta))
        eos = sorted(set(pilot.batch["responses"][:, 9].tolist()))
    else:
        eos = list(range(0, len(tokenizer), 6))  # about one token in six ends a row: rows stop early
    prompts = DataProto.from_dict(tensors=batch, meta_info={**meta, "eos_token_id": eos})
    every_step, sparse = rollout(model, tokenizer, static_cache=static), rollout(model, tokenizer, static_cache=static)
    every_counts, sparse_counts, ends = count_steps(every_step), count_steps(sparse), []
    assert hf_rollout.stop_check_interval(torch.device("cpu"), False) == 1
    assert hf_rollout.stop_check_interval(torch.device("cuda"), False) == hf_rollout.STOP_CHECK_EVERY
    assert hf_rollout.stop_check_interval(torch.device("cuda"), True) == 1
    for _ in range(3):  # the generator ends each call where the every-step loop leaves it
        want = every_step.generate_sequences(prompts)
        monkeypatch.setattr(hf_rollout, "stop_check_interval", lambda device, stop_strings: 4)
        got = sparse.generate_sequences(prompts)
        monkeypatch.undo()
        for key in ("responses", "rollout_log_probs", "response_mask"):
            assert torch.equal(got.batch[key], want.batch[key]), key
        assert torch.equal(sparse.generator.get_state(), every_step.generator.get_state())
        last = int(want.batch["response_mask"].sum(dim=1).max()) - 1  # step after which every row had stopped
        assert every_counts[-1] == last  # decoder steps: one per token after the first
        assert sparse_counts[-1] == min(23, last + 3 - last % 4)  # up to the next check (steps 3, 7, 11, ...)
        ends.append(last)
        every_counts.append(0)
        sparse_counts.append(0)
    assert any(end < 23 and end % 4 != 3 for end in ends), ends  # some call really ran past its end
