"""``atomic_save``: a failed write leaves the earlier file, removes the partial one, and a full disk
is named as such (torch's zip writer reports it only as "unexpected pos")."""

from __future__ import annotations

import errno
import shutil
from collections import namedtuple

import pytest
import torch

from rlvr.workers import checkpoint

Usage = namedtuple("Usage", "total used free")


def _failing_save(obj, name):
    with open(name, "wb") as handle:
        handle.write(b"x" * 3 * 2**20)  # 3 MiB written, then the writer fails as torch's does
    raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 782270400 vs 782270288")


def test_a_write_replaces_the_file_and_leaves_no_temporary(tmp_path):
    checkpoint.atomic_save({"w": torch.arange(3)}, tmp_path / "model.pt")
    checkpoint.atomic_save({"w": torch.arange(4)}, tmp_path / "model.pt")
    assert torch.equal(torch.load(tmp_path / "model.pt")["w"], torch.arange(4))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt"]


def test_a_full_disk_is_named_and_the_earlier_file_survives(tmp_path, monkeypatch):
    checkpoint.atomic_save({"w": torch.arange(3)}, tmp_path / "optim.pt")
    monkeypatch.setattr(checkpoint.torch, "save", _failing_save)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10 * 2**30, 10 * 2**30 - 2**20, 2**20))
    with pytest.raises(OSError, match=r"optim\.pt failed after 3 MiB with 1 MiB free on its disk .*unexpected pos"
                                      r".*trainer\.default_local_dir") as raised:
        checkpoint.atomic_save({"w": torch.arange(5)}, tmp_path / "optim.pt")
    assert raised.value.errno == errno.ENOSPC
    monkeypatch.undo()
    assert torch.equal(torch.load(tmp_path / "optim.pt")["w"], torch.arange(3))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["optim.pt"]


def test_other_failures_are_raised_as_they_are(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint.torch, "save", _failing_save)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10 * 2**30, 2**30, 9 * 2**30))
    with pytest.raises(RuntimeError, match="unexpected pos"):
        checkpoint.atomic_save({"w": 1}, tmp_path / "model.pt")
    assert list(tmp_path.iterdir()) == []
