"""Config validation of the vLLM engine's keys and of the rollout correction."""

from __future__ import annotations

import importlib.util

import pytest
from trainer_helpers import tiny_overrides

from rlvr.trainer.config import load_config, validate_config
from rlvr.utils.errors import ConfigError

HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.fixture
def config(tiny_model_dir, tiny_data, tmp_path):
    def make(**extra):
        return load_config("grpo", tiny_overrides(tiny_model_dir, tiny_data, tmp_path / "run", **extra))

    return make


@pytest.mark.skipif(HAS_VLLM, reason="this Python has vLLM")
def test_vllm_without_vllm_names_the_install_command(config):
    with pytest.raises(ConfigError, match="rollout.name.*make setup-vllm.*rlvr\\[vllm\\]"):
        validate_config(config(**{"actor_rollout_ref.rollout.name": "vllm"}))


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="needs vLLM (make setup-vllm)")
def test_vllm_keys_are_checked(config):
    validate_config(config(**{"actor_rollout_ref.rollout.name": "vllm"}))
    bad = {"tensor_model_parallel_size": 2, "dtype": "float16", "gpu_memory_utilization": 1.5,
           "load_format": "gguf", "max_num_seqs": 0}
    for workers, tp in ((2, 1), (2, 2), (4, 2)):  # an engine on every worker, or one per tp workers
        validate_config(config(**{"actor_rollout_ref.rollout.name": "vllm", "trainer.backend": "ray",
                                  "trainer.n_gpus_per_node": workers, "actor_rollout_ref.rollout.n": 4,
                                  "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 1,
                                  "actor_rollout_ref.rollout.tensor_model_parallel_size": tp}))
    for key, value in bad.items():
        with pytest.raises(ConfigError, match=f"actor_rollout_ref.rollout.{key}"):
            validate_config(config(**{"actor_rollout_ref.rollout.name": "vllm", f"actor_rollout_ref.rollout.{key}": value}))


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="needs vLLM (make setup-vllm)")
def test_vllm_refuses_top_p_and_top_k_in_training(config):
    key = "actor_rollout_ref.rollout"
    for name, value in (("top_p", 0.9), ("top_k", 20)):
        with pytest.raises(ConfigError, match=f"{key}.{name}.*renormalised.*{key}.top_p=1.0 and {key}.top_k=-1"):
            validate_config(config(**{f"{key}.name": "vllm", f"{key}.{name}": value}))
        # greedy training ignores them; validation only scores its responses (its log-probs are unused)
        validate_config(config(**{f"{key}.name": "vllm", f"{key}.{name}": value, f"{key}.do_sample": False}))
        validate_config(config(**{f"{key}.name": "vllm", f"{key}.val_kwargs.{name}": value,
                                  f"{key}.val_kwargs.do_sample": True, f"{key}.val_kwargs.temperature": 1.0}))
        validate_config(config(**{f"{key}.{name}": value}))  # the HF engine's log-probs are of the full distribution


def test_rollout_correction_settings_are_checked(config):
    key = "algorithm.rollout_correction"
    validate_config(config(**{f"{key}.rollout_is": "sequence", f"{key}.rollout_rs": "token",
                              f"{key}.rollout_rs_threshold": 3.0, f"{key}.rollout_rs_threshold_lower": 0.2}))
    with pytest.raises(ConfigError, match="rollout_is.*use one of geometric, sequence, token"):
        validate_config(config(**{f"{key}.rollout_is": "seq"}))
    with pytest.raises(ConfigError, match="rollout_rs.*use one of"):
        validate_config(config(**{f"{key}.rollout_rs": "tok"}))
    with pytest.raises(ConfigError, match="rollout_is_threshold"):
        validate_config(config(**{f"{key}.rollout_is_threshold": 0.0}))
    with pytest.raises(ConfigError, match="rollout_rs_threshold.*0 < lower < upper"):
        validate_config(config(**{f"{key}.rollout_rs": "token", f"{key}.rollout_rs_threshold": 2.0,
                                  f"{key}.rollout_rs_threshold_lower": 3.0}))


def test_rollout_quantization_is_checked(config):
    key = "actor_rollout_ref.rollout.quantization"
    validate_config(config(**{key: "fp8"}))
    with pytest.raises(ConfigError, match=f"{key}.*'int8' is not valid; use fp8 or null"):
        validate_config(config(**{key: "int8"}))
    with pytest.raises(ConfigError, match=f"{key}.*cannot hold LoRA adapters"):
        validate_config(config(**{key: "fp8", "actor_rollout_ref.model.lora_rank": 4}))


def test_vllm_load_format_takes_the_weight_file_formats(config, monkeypatch):
    """verl's scripts start vLLM with ``load_format=safetensors``: the checkpoint's weights, like ``auto``."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real(name, *a))
    key = "actor_rollout_ref.rollout"
    for value in ("dummy", "auto", "safetensors", "pt"):
        cfg = config(**{f"{key}.name": "vllm", f"{key}.load_format": value})
        validate_config(cfg)
        assert cfg.actor_rollout_ref.rollout.load_format == value
    with pytest.raises(ConfigError, match=f"{key}.load_format.*'gguf' is not valid.*dummy, auto, safetensors, pt"):
        validate_config(config(**{f"{key}.name": "vllm", f"{key}.load_format": "gguf"}))
