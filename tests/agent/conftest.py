"""Fixtures of the agent tests: an EOS-prone tiny model (it ends a turn after a few tokens) and
GSM8K-like questions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agent_helpers import eos_prone_tiny_model


def _save_eos_prone(path: Path, **model_kwargs) -> Path:
    model, tokenizer = eos_prone_tiny_model(**model_kwargs)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def eos_prone_model_dir(tmp_path_factory) -> Path:
    return _save_eos_prone(tmp_path_factory.mktemp("eos_prone") / "model")


@pytest.fixture(scope="module")
def vllm_eos_prone_model_dir(tmp_path_factory) -> Path:
    """The same kind of model with head size 64 (vLLM's CPU attention kernels take no smaller heads)."""
    return _save_eos_prone(tmp_path_factory.mktemp("vllm_eos_prone") / "model", hidden_size=128,
                           num_attention_heads=2, num_key_value_heads=1, intermediate_size=256)


@pytest.fixture(scope="module")
def gsm8k_like_data(tmp_path_factory) -> dict[str, Path]:
    """Tiny questions scored by the strict GSM8K scorer ("#### <answer>"), which the retry environment uses too."""
    root = tmp_path_factory.mktemp("data")

    def write(name: str, size: int) -> Path:
        rows = [{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": f"what is {i} + 1"}],
                 "reward_model": {"ground_truth": str(i + 1)}, "extra_info": {"index": i}} for i in range(size)]
        path = root / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return path

    return {"train": write("train", 16), "val": write("val", 4)}
