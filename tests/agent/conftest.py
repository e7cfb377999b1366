"""Fixtures of the agent tests: an EOS-prone tiny model (it ends a turn after a few tokens), a tiny
model trained to call the calculator, and GSM8K-like questions."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from agent_helpers import VLLM_SIZE, eos_prone_tiny_model, tool_calling_tiny_model


def _save(path: Path, make: Callable, **model_kwargs) -> Path:
    model, tokenizer = make(**model_kwargs)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def eos_prone_model_dir(tmp_path_factory) -> Path:
    return _save(tmp_path_factory.mktemp("eos_prone") / "model", eos_prone_tiny_model)


@pytest.fixture(scope="module")
def vllm_eos_prone_model_dir(tmp_path_factory) -> Path:
    """The same kind of model with head size 64 (``VLLM_SIZE``)."""
    return _save(tmp_path_factory.mktemp("vllm_eos_prone") / "model", eos_prone_tiny_model, **VLLM_SIZE)


@pytest.fixture(scope="module")
def tool_calling_model_dir(tmp_path_factory) -> Path:
    """The tiny model trained to call the calculator (:func:`agent_helpers.tool_calling_tiny_model`)."""
    return _save(tmp_path_factory.mktemp("tool_calling") / "model", tool_calling_tiny_model)


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
