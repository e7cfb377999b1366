"""The vLLM engine against the HF engine on a tiny random model: same greedy ids, masks and EOS /
stop-string handling, log-probs equal to a transformers forward, in-place weight sync (tied LM head,
prefix cache) and the weights version of every token. Needs vLLM (``make setup-vllm``; run with ``make test-vllm``)."""

from __future__ import annotations

import copy

import pytest
import torch
from omegaconf import OmegaConf

from rlvr.protocol import DataProto
from rlvr.trainer.config.schema import RolloutConfig
from rlvr.utils.testing import forward_log_probs, tiny_causal_lm
from rlvr.utils.torch_functional import compute_position_ids
from rlvr.workers.rollout import HFRollout, VLLMRollout

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

TEXTS = ["1+1=", "hello there, how are", "abc", "the cat sat on"]
RESPONSE_LENGTH = 12


def rollout_config(**overrides):
    cfg = OmegaConf.structured(RolloutConfig)
    cfg.response_length, cfg.prompt_length = RESPONSE_LENGTH, 32
    cfg.kv_cache_memory_bytes = 64 << 20
    for key, value in overrides.items():
        cfg[key] = value
    return cfg


@pytest.fixture(scope="module")
def tiny():
    # head size 64: the CPU attention kernels of vLLM support it (the default tiny model's 8 they do not)
    return tiny_causal_lm(hidden_size=128, num_attention_heads=2, num_key_value_heads=1, intermediate_size=256, seed=4)


@pytest.fixture(scope="module")
def engines(tiny):
    model, tokenizer = tiny
    hf = HFRollout(rollout_config(), model, tokenizer, "cpu", seed=0, owns_module=False)
    vllm_engine = VLLMRollout(rollout_config(), model, tokenizer, "cpu", seed=0, owns_module=True)
    vllm_engine.update_weights(model.named_parameters(), 0)
    return hf, vllm_engine


def prompts(tokenizer, **meta) -> DataProto:
    enc = tokenizer(TEXTS, return_tensors="pt", padding=True, padding_side="left")
    mask = enc["attention_mask"]
    return DataProto.from_dict(tensors={"input_ids": enc["input_ids"], "attention_mask": mask,
                                        "position_ids": compute_position_ids(mask)}, meta_info=meta)


def assert_same_generation(a: DataProto, b: DataProto) -> None:
    for key in ("prompts", "responses", "input_ids", "attention_mask", "position_ids", "response_mask"):
        assert torch.equal(a.batch[key], b.batch[key]), key
    mask = a.batch["response_mask"].bool()
    diff = (a.batch["rollout_log_probs"] - b.batch["rollout_log_probs"])[mask].abs().max()
    assert diff < 1e-4, diff
    assert not b.batch["rollout_log_probs"][~mask].any()


def test_greedy_matches_the_hf_engine(tiny, engines):
    _, tokenizer = tiny
    hf, vllm_engine = engines
    expected = hf.generate_sequences(prompts(tokenizer, do_sample=False))
    got = vllm_engine.generate_sequences(prompts(tokenizer, do_sample=False))
    assert_same_generation(expected, got)
    assert got.batch["responses"].shape == (len(TEXTS), RESPONSE_LENGTH)
    assert got.meta_info == {"rollout_log_prob_temperature": 1.0, "rollout_log_probs_exact": False,
                             "rollout_weights_version": 0}


def test_validation_decodes_with_val_kwargs(tiny, engines):
    _, tokenizer = tiny
    hf, vllm_engine = engines
    assert vllm_engine.config.do_sample and not vllm_engine.config.val_kwargs.do_sample  # sampling vs greedy
    expected = hf.generate_sequences(prompts(tokenizer, do_sample=False))
    got = vllm_engine.generate_sequences(prompts(tokenizer, validate=True))
    assert_same_generation(expected, got)
    assert got.meta_info["rollout_log_prob_temperature"] == 1.0


def _mid_response_token(responses: torch.Tensor) -> int:
    """A token that the greedy decode emits after the first position of some row."""
    return int(responses[1, 3])


def test_eos_and_stop_strings_end_rows_like_the_hf_engine(tiny, engines):
    model, tokenizer = tiny
    hf, vllm_engine = engines
    eos = _mid_response_token(hf.generate_sequences(prompts(tokenizer, do_sample=False)).batch["responses"])
    stop = tokenizer.decode([eos])
    hf_with_stop = HFRollout(rollout_config(stop=[stop]), model, tokenizer, "cpu", seed=0, owns_module=False)
    # the stop string comes from the config (HF engine) and from the call (vLLM engine): the same rule
    for hf_engine, hf_meta, meta in ((hf, {"eos_token_id": eos}, {"eos_token_id": eos}),
                                     (hf_with_stop, {}, {"stop": [stop]})):
        expected = hf_engine.generate_sequences(prompts(tokenizer, do_sample=False, **hf_meta))
        got = vllm_engine.generate_sequences(prompts(tokenizer, do_sample=False, **meta))
        assert_same_generation(expected, got)
        mask, responses = got.batch["response_mask"], got.batch["responses"]
        length = int(mask[1].sum())
        assert 1 <= length <= 4 and mask[1, :length].all()  # row 1 stopped at position 3 or before
        assert int(responses[1, length - 1]) == eos or stop in tokenizer.decode(responses[1, :length])  # kept
        assert (responses[mask == 0] == tokenizer.pad_token_id).all()


def test_response_length_of_one_call(tiny, engines):
    _, tokenizer = tiny
    out = engines[1].generate_sequences(prompts(tokenizer, do_sample=False, response_length=5))
    assert out.batch["responses"].shape == (len(TEXTS), 5)
    with pytest.raises(ValueError, match="response_length"):
        engines[1].generate_sequences(prompts(tokenizer, response_length=RESPONSE_LENGTH + 1))


def test_sampling_n_and_log_probs_match_a_forward_pass(tiny, engines):
    model, tokenizer = tiny
    out = engines[1].generate_sequences(prompts(tokenizer, n=3, temperature=0.8))
    assert out.batch["responses"].shape[0] == 3 * len(TEXTS)
    assert out.meta_info["rollout_log_prob_temperature"] == 0.8
    first_rows = out.batch["responses"][0:3]
    assert not (torch.equal(first_rows[0], first_rows[1]) and torch.equal(first_rows[1], first_rows[2]))
    mask = out.batch["response_mask"].bool()
    diff = (forward_log_probs(model, out.batch, 0.8) - out.batch["rollout_log_probs"])[mask].abs().max()
    assert diff < 1e-4, diff


def test_weights_sync_in_place_with_tied_head_and_fresh_prefix_cache(tiny, engines):
    model, tokenizer = tiny
    _, vllm_engine = engines
    vllm_engine.generate_sequences(prompts(tokenizer, do_sample=False))  # fills the prefix cache
    new_model = copy.deepcopy(model)
    with torch.no_grad():
        for param in new_model.parameters():
            param.add_(0.05 * torch.randn_like(param))
    assert new_model.lm_head.weight is new_model.model.embed_tokens.weight  # tied: only one name is sent
    vllm_engine.update_weights(new_model.named_parameters(), 1)
    got = vllm_engine.generate_sequences(prompts(tokenizer, do_sample=False))
    expected = HFRollout(rollout_config(), new_model, tokenizer, "cpu", 0, False).generate_sequences(
        prompts(tokenizer, do_sample=False))
    assert_same_generation(expected, got)
    assert vllm_engine.weights_version == got.meta_info["rollout_weights_version"] == 1
    mask = got.batch["response_mask"].bool()  # the version of every sampled token, -1 on the padding
    assert got.batch["response_versions"][mask].eq(1).all() and got.batch["response_versions"][~mask].eq(-1).all()
    vllm_engine.update_weights(model.named_parameters(), 0)  # back for the other tests


def test_sleep_and_wake_up_are_no_ops_on_cpu(tiny, engines):
    _, tokenizer = tiny
    vllm_engine = engines[1]
    vllm_engine.sleep()
    assert not vllm_engine.asleep and not vllm_engine.sleep_mode
    vllm_engine.wake_up()
    assert vllm_engine.generate_sequences(prompts(tokenizer, do_sample=False)).batch["responses"].shape[0] == 4
