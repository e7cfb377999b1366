"""Files that are whole or absent: a text file written to a temporary file beside it, synced to
disk, then renamed over the old one (a crash or a failed write leaves the old file as it was)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["write_text_atomic"]


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Replace the file ``path`` by ``text`` (UTF-8) atomically: ``path`` holds either its old
    content or all of ``text``, never a part. The temporary file (``.<name>.tmp-*`` in the same
    folder, so the rename stays on one file system) is removed when the write fails."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.tmp-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
