"""Fixtures of the reward-worker tests: the tiny byte-level tokenizer on disk."""

from __future__ import annotations

import pytest

from rlvr.utils.testing import tiny_tokenizer


@pytest.fixture(scope="session")
def tokenizer_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("tiny_tokenizer")
    tiny_tokenizer().save_pretrained(path)
    return str(path)
