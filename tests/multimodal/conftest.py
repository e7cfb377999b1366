"""Fixtures of the multimodal tests: the tiny Qwen2-VL and Qwen2.5-VL model folders (random weights,
processors built from their parts) and a small dataset of images in verl's format."""

from __future__ import annotations

from pathlib import Path

import pytest
from mm_helpers import write_image_rows

from rlvr.utils.tiny_vlm import save_tiny_qwen_vl


@pytest.fixture(scope="session")
def vl_dirs(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("tiny_vl")
    return {kind: save_tiny_qwen_vl(root / kind, kind) for kind in ("qwen2_vl", "qwen2_5_vl")}


@pytest.fixture(scope="session")
def image_data(tmp_path_factory) -> Path:
    return write_image_rows(tmp_path_factory.mktemp("image_data"), count=4)
