"""The static-KV-cache decode path gives the same tokens and log-probs as the default one."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from rlvr.protocol import DataProto
from rlvr.trainer.config.schema import RolloutConfig
from rlvr.utils.testing import tiny_causal_lm
from rlvr.utils.torch_functional import compute_position_ids
from rlvr.workers.rollout import HFRollout
from rlvr.workers.rollout.gqa_attention import GROUPED_SDPA, grouped_sdpa_attention
from rlvr.workers.rollout.static_decode import DynamicCacheDecoder, StaticCacheDecoder


@pytest.fixture(scope="module")
def model_and_tokenizer():
    return tiny_causal_lm(hidden_size=64, num_hidden_layers=2, seed=3)


def left_padded(tokenizer, texts: list[str]) -> dict[str, torch.Tensor]:
    enc = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left")
    mask = enc["attention_mask"]
    return {"input_ids": enc["input_ids"], "attention_mask": mask, "position_ids": compute_position_ids(mask)}


TEXTS = ["1+1=", "hello there, how are", "abc", "the cat sat on"]


@torch.no_grad()
def greedy_logits(decoder, batch: dict[str, torch.Tensor], steps: int) -> list[torch.Tensor]:
    """Logits ``[b, vocab]`` of every step of a greedy decode."""
    logits = decoder.prefill(batch["input_ids"], batch["attention_mask"], batch["position_ids"])
    next_pos = batch["position_ids"][:, -1] + 1
    out = [logits.float().clone()]
    for step in range(steps):
        logits = decoder.step(logits.argmax(-1), next_pos + step)
        out.append(logits.float().clone())
    decoder.finish()
    return out


def test_static_cache_logits_match_the_growing_cache_and_survive_reuse(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    batch = left_padded(tokenizer, TEXTS)
    width = batch["input_ids"].shape[1]
    expected = greedy_logits(DynamicCacheDecoder(model), batch, steps=10)
    static = StaticCacheDecoder(model, max_cache_len=width + 11, compile=False)
    for _ in range(2):  # the second call reuses (and first zeroes) the same cache
        got = greedy_logits(static, batch, steps=10)
        for want, have in zip(expected, got, strict=True):
            torch.testing.assert_close(have, want, rtol=1e-4, atol=1e-5)
    assert list(static._caches) == [len(TEXTS)]
    static.free()
    assert static._caches == {}


def test_static_cache_rejects_a_prompt_that_does_not_fit(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    batch = left_padded(tokenizer, TEXTS)
    static = StaticCacheDecoder(model, max_cache_len=batch["input_ids"].shape[1], compile=False)
    with pytest.raises(ValueError, match="raise rollout.prompt_length"):
        static.prefill(batch["input_ids"], batch["attention_mask"], batch["position_ids"])


def rollout(model, tokenizer, **overrides) -> HFRollout:
    values = {"response_length": 12, "prompt_length": 32, "micro_batch_size": 8, **overrides}
    config = OmegaConf.structured(RolloutConfig(**values))
    return HFRollout(config, model, tokenizer, "cpu", seed=5, owns_module=False)


@pytest.mark.parametrize("meta", [{"validate": True}, {}], ids=["greedy", "sampled"])
def test_hf_engine_with_static_cache_generates_the_same_responses(model_and_tokenizer, meta):
    model, tokenizer = model_and_tokenizer
    prompts = DataProto.from_dict(tensors=left_padded(tokenizer, TEXTS), meta_info=dict(meta))
    static = rollout(model, tokenizer, static_cache=True, ignore_eos=True)
    plain = rollout(model, tokenizer, ignore_eos=True)
    for _ in range(2):  # the second call reuses the static cache; both generators advance alike
        a, b = static.generate_sequences(prompts), plain.generate_sequences(prompts)
        assert a.batch["responses"].shape == (4, 12)
        assert torch.equal(a.batch["responses"], b.batch["responses"])
        assert bool((a.batch["response_mask"] == 1).all())
        torch.testing.assert_close(a.batch["rollout_log_probs"], b.batch["rollout_log_probs"], rtol=1e-4, atol=1e-5)


def test_compile_needs_the_static_cache(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    with pytest.raises(ValueError, match="rollout.compile needs rollout.static_cache"):
        rollout(model, tokenizer, compile=True)


@pytest.mark.slow
def test_compiled_static_step_matches_eager(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    batch = left_padded(tokenizer, TEXTS)
    width = batch["input_ids"].shape[1]
    expected = greedy_logits(DynamicCacheDecoder(model), batch, steps=6)
    got = greedy_logits(StaticCacheDecoder(model, max_cache_len=width + 7, compile=True), batch, steps=6)
    for want, have in zip(expected, got, strict=True):
        torch.testing.assert_close(have, want, rtol=1e-4, atol=1e-5)


def test_grouped_one_token_attention_equals_repeated_kv_heads():
    gen = torch.Generator().manual_seed(0)
    query = torch.randn(3, 6, 1, 8, generator=gen)  # 6 query heads
    key, value = torch.randn(3, 2, 5, 8, generator=gen), torch.randn(3, 2, 5, 8, generator=gen)  # 2 kv heads
    mask = torch.ones(3, 1, 1, 5, dtype=torch.bool)
    mask[0, ..., :2] = False  # left padding of row 0
    out, weights = grouped_sdpa_attention(None, query, key, value, mask, scaling=0.5)
    ref = torch.nn.functional.scaled_dot_product_attention(
        query, key.repeat_interleave(3, dim=1), value.repeat_interleave(3, dim=1), attn_mask=mask, scale=0.5)
    assert weights is None and out.shape == (3, 1, 6, 8)
    torch.testing.assert_close(out, ref.transpose(1, 2))


def test_static_decoder_uses_grouped_attention_only_while_decoding(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    assert model.config._attn_implementation == "sdpa"
    batch = left_padded(tokenizer, TEXTS)
    static = StaticCacheDecoder(model, max_cache_len=batch["input_ids"].shape[1] + 3, compile=False)
    static.prefill(batch["input_ids"], batch["attention_mask"], batch["position_ids"])
    assert model.config._attn_implementation == GROUPED_SDPA
    static.finish()
    assert model.config._attn_implementation == "sdpa"
