"""The update's FLOP count and MFU, and the parameter counts of the benchmark's workloads."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from benchmarks.decode_floor import kv_bytes_per_token
from benchmarks.model_flops import (
    FlopShape,
    decoder_params,
    flop_shape,
    peak_tflops,
    step_flops,
    utilisation,
)
from benchmarks.workload import WORKLOADS, model_config


def _meta_params(cfg) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in AutoModelForCausalLM.from_config(cfg).parameters())


def test_step_flops_by_hand():
    shape = FlopShape(layers=2, attention_width=8, body_params=100, head_params=50)
    # sequences of 3 and 5 tokens, 4 response tokens: 6*100*8 + 6*50*4 + 12*2*8*(3^2 + 5^2)
    assert step_flops(shape, [3, 5], 4) == 4800 + 1200 + 6528


def test_qwen_1p5b_shape_has_1p54b_parameters():
    cfg = model_config(WORKLOADS["qwen2.5-1.5b"], 49152, 2, 1, 2)
    assert cfg.model_type == "qwen2" and cfg.vocab_size == 151936 and cfg.tie_word_embeddings
    # by hand: embedding 151936*1536; per layer q 1536*1536+1536, k and v 1536*256+256 each,
    # o 1536*1536, MLP 3*1536*8960, two norms 2*1536; final norm 1536
    layer = (1536 * 1536 + 1536) + 2 * (1536 * 256 + 256) + 1536 * 1536 + 3 * 1536 * 8960 + 2 * 1536
    expected = 151936 * 1536 + 28 * layer + 1536
    assert expected == 1_543_714_304
    assert sum(decoder_params(cfg)) == expected == _meta_params(cfg)
    shape = flop_shape(cfg)
    assert shape.head_params == 151936 * 1536 and shape.attention_width == 1536 and shape.layers == 28
    assert shape.body_params == expected - 151936 * 1536


@pytest.mark.parametrize("size", ["tiny", "smollm2-135m", "tiny-qwen2"])
def test_parameter_formula_matches_the_built_model(size):
    cfg = model_config(WORKLOADS[size], 49152, 2, 1, 2)
    assert sum(decoder_params(cfg)) == _meta_params(cfg)


@pytest.mark.parametrize("size", ["tiny", "smollm2-135m"])
def test_llama_workload_configs_are_unchanged(size):
    work = WORKLOADS[size]
    before = LlamaConfig(
        vocab_size=49152, hidden_size=work.hidden_size, intermediate_size=work.intermediate_size,
        num_hidden_layers=work.num_hidden_layers, num_attention_heads=work.num_attention_heads,
        num_key_value_heads=work.num_key_value_heads, max_position_embeddings=2048,
        rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True, hidden_act="silu",
        pad_token_id=2, bos_token_id=1, eos_token_id=2)
    assert model_config(work, 49152, 2, 1, 2).to_json_string() == before.to_json_string()


def test_qwen2_config_settings_and_kv_bytes():
    cfg = model_config(WORKLOADS["qwen2.5-1.5b"], 49152, 2, 1, 2)
    assert (cfg.rms_norm_eps, cfg.rope_parameters["rope_theta"], cfg.num_key_value_heads) == (1e-6, 1e6, 2)
    assert not cfg.use_sliding_window and cfg.pad_token_id == 2
    tiny = AutoModelForCausalLM.from_config(model_config(WORKLOADS["tiny-qwen2"], 49152, 2, 1, 2))
    assert tiny.model.layers[0].self_attn.q_proj.bias is not None
    # 2 layers x (k, v) x 2 kv heads x head_dim 64/4 x 4 bytes (Qwen2 configs have no head_dim)
    assert kv_bytes_per_token(tiny) == 2 * 2 * 2 * 16 * 4


def test_peak_table_override_and_utilisation(monkeypatch):
    assert peak_tflops(torch.device("cpu")) is None
    assert peak_tflops(torch.device("cpu"), 100.0) == 100.0
    for name, peak in (("NVIDIA H200", 989.4), ("NVIDIA H100 80GB HBM3", 989.4), ("NVIDIA H100 PCIe", 756.5),
                       ("Some GPU", None)):
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None, name=name: name)
        assert peak_tflops(torch.device("cuda")) == peak
    assert utilisation(2e12, 0.5, 8.0) == {"tflops": 4.0, "mfu": 0.5}
    assert utilisation(2e12, 0.5, None) == {"tflops": 4.0, "mfu": None}
