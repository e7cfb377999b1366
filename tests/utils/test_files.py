"""rlvr.utils.files.write_text_atomic: the file holds the old text or all of the new, and a failed
write leaves no temporary file behind."""

from __future__ import annotations

import os

import pytest

from rlvr.utils import files
from rlvr.utils.files import write_text_atomic


def test_the_new_text_replaces_the_old_and_no_temporary_file_stays(tmp_path):
    path = tmp_path / "latest_checkpointed_iteration.txt"
    write_text_atomic(path, "3")
    write_text_atomic(path, "héllo\n12")
    assert path.read_text(encoding="utf-8") == "héllo\n12"
    assert os.listdir(tmp_path) == [path.name]


def test_a_write_that_fails_leaves_the_old_file_and_removes_its_temporary_file(tmp_path, monkeypatch):
    path = tmp_path / "warm_start.json"
    write_text_atomic(path, '{"acc": 0.5}')

    def disk_fails(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, "fsync", disk_fails)
    with pytest.raises(OSError, match="No space left"):
        write_text_atomic(path, '{"acc": 0.9}')
    assert path.read_text(encoding="utf-8") == '{"acc": 0.5}'
    assert os.listdir(tmp_path) == [path.name]
