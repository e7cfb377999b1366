"""The per-call engine options of the hf engine: ``meta_info["response_length"]`` and ``meta_info["stop"]``."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from rlvr.protocol import DataProto
from rlvr.trainer.config.schema import RolloutConfig
from rlvr.utils.testing import tiny_causal_lm
from rlvr.utils.torch_functional import compute_position_ids
from rlvr.workers.rollout import HFRollout

TEXTS = ["1+1=", "hello there, how are", "abc", "the cat sat on"]


@pytest.fixture(scope="module")
def model_and_tokenizer():
    return tiny_causal_lm(hidden_size=64, num_hidden_layers=2, seed=3)


def engine(model, tokenizer, **overrides) -> HFRollout:
    values = {"response_length": 12, "prompt_length": 32, "micro_batch_size": 8, **overrides}
    return HFRollout(OmegaConf.structured(RolloutConfig(**values)), model, tokenizer, "cpu", seed=5, owns_module=False)


def prompts(tokenizer, **meta) -> DataProto:
    enc = tokenizer(TEXTS, return_tensors="pt", padding=True, padding_side="left")
    mask = enc["attention_mask"]
    tensors = {"input_ids": enc["input_ids"], "attention_mask": mask, "position_ids": compute_position_ids(mask)}
    return DataProto.from_dict(tensors=tensors, meta_info=meta)


def test_response_length_per_call_sets_the_width_and_keeps_the_same_tokens(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    full = engine(model, tokenizer, ignore_eos=True).generate_sequences(prompts(tokenizer))
    short = engine(model, tokenizer, ignore_eos=True).generate_sequences(prompts(tokenizer, response_length=5))
    width = full.batch["prompts"].shape[1]
    assert short.batch["responses"].shape == (4, 5)
    for key in ("input_ids", "attention_mask", "position_ids"):
        assert short.batch[key].shape == (4, width + 5)
    assert torch.equal(short.batch["responses"], full.batch["responses"][:, :5])  # same seed, same draws
    torch.testing.assert_close(short.batch["rollout_log_probs"], full.batch["rollout_log_probs"][:, :5])


@pytest.mark.parametrize("length", [0, 13])
def test_response_length_outside_the_configured_range_is_an_error(model_and_tokenizer, length):
    model, tokenizer = model_and_tokenizer
    with pytest.raises(ValueError, match="must be in \\[1, rollout.response_length=12\\]"):
        engine(model, tokenizer).generate_sequences(prompts(tokenizer, response_length=length))


def test_stop_per_call_replaces_the_configured_stop_strings(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    sampled = engine(model, tokenizer, ignore_eos=True).generate_sequences(prompts(tokenizer)).batch["responses"]
    stop = tokenizer.decode(sampled[2, 3:5].tolist())
    # the configured stop string never occurs (it is replaced); the per-call one does in row 2
    out = engine(model, tokenizer, ignore_eos=True, stop=["\x00never"]).generate_sequences(
        prompts(tokenizer, stop=[stop])).batch
    for row in range(4):
        length = int(out["response_mask"][row].sum())
        assert torch.equal(out["responses"][row, :length], sampled[row, :length])
        assert stop not in tokenizer.decode(out["responses"][row, : length - 1].tolist())
        assert length == 12 or stop in tokenizer.decode(out["responses"][row, :length].tolist())
    row2 = int(out["response_mask"][2].sum())
    assert row2 <= 5 and out["response_mask"][2, row2 - 1] == 1  # the completing token is kept, mask 1
    assert out["responses"][2, row2:].eq(tokenizer.pad_token_id).all()


def test_static_cache_refuses_a_call_that_would_overflow_it(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    batch = prompts(tokenizer, response_length=12)
    small = engine(model, tokenizer, static_cache=True, prompt_length=batch.batch["input_ids"].shape[1] - 2)
    with pytest.raises(ValueError, match="meta_info\\['response_length'\\]"):
        small.generate_sequences(batch)
    assert small.generate_sequences(prompts(tokenizer, response_length=10)).batch["responses"].shape == (4, 10)
