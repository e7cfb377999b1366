"""rlvr.utils.files: the file holds the old content or all of the new, and a failed write leaves no
temporary file behind (text through write_text_atomic, any writer through replaced_atomically)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from rlvr.utils import files
from rlvr.utils.files import leftover_temporaries, replaced_atomically, write_text_atomic


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


def test_any_writer_replaces_the_file_in_one_rename_and_a_failing_one_changes_nothing(tmp_path, monkeypatch):
    path = tmp_path / "model.pt"
    path.write_bytes(b"old")
    synced = []
    monkeypatch.setattr(files.os, "fsync", synced.append)
    with pytest.raises(RuntimeError, match="writer died"):
        with replaced_atomically(path) as tmp:
            assert os.path.dirname(tmp) == str(tmp_path) and os.path.basename(tmp).startswith(".model.pt.tmp-")
            with open(tmp, "wb") as f:
                f.write(b"half")
            raise RuntimeError("writer died")
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == [path.name]
    with replaced_atomically(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(b"new")
        assert path.read_bytes() == b"old"  # nothing visible before the block ends
    assert path.read_bytes() == b"new" and os.listdir(tmp_path) == [path.name] and synced == []
    with replaced_atomically(path, durable=True) as tmp:
        with open(tmp, "wb") as f:
            f.write(b"synced")
    assert path.read_bytes() == b"synced" and len(synced) == 1


def test_a_writer_killed_inside_the_block_leaves_its_temporary_file_and_it_is_found(tmp_path):
    path = tmp_path / "step [1].txt"  # glob's special characters in the name
    path.write_text("old")
    (tmp_path / "step 1.txt.tmp-x").write_text("")  # what the pattern must not take: not a temporary of it
    killed = subprocess.run([sys.executable, "-c", (
        "import os, signal, sys\n"
        "from rlvr.utils.files import replaced_atomically\n"
        "with replaced_atomically(sys.argv[1]) as tmp:\n"
        "    open(tmp, 'w').write('half')\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"), str(path)], timeout=60)
    assert killed.returncode == -signal.SIGKILL
    assert path.read_text() == "old"
    left = leftover_temporaries(path)
    assert len(left) == 1 and left[0].name.startswith(".step [1].txt.tmp-") and left[0].read_text() == "half"
    left[0].unlink()
    assert leftover_temporaries(path) == []
