"""Files that are whole or absent: written to a temporary file beside the target, then renamed over
it (a crash or a failed write leaves the old file as it was, and no temporary file behind).

:func:`replaced_atomically` is the pattern for any writer (``torch.save``, ``pickle.dump``, text);
:func:`write_text_atomic` is it for text, synced to disk before the rename.
"""

from __future__ import annotations

import glob
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["replaced_atomically", "write_text_atomic", "leftover_temporaries"]


@contextmanager
def replaced_atomically(path: str | os.PathLike, durable: bool = False) -> Iterator[str]:
    """Yield a temporary path beside ``path`` (``.<name>.tmp-*`` in the same folder, so the rename
    stays on one file system) for the block to write; when the block returns, the temporary file
    replaces ``path`` in one rename, so ``path`` holds either its old content or all of the new.
    When the block (or the rename) fails, the temporary file is removed and the error goes on.

    Args:
        path: the file to replace (its folder must exist).
        durable: fsync the temporary file before the rename (the new content survives a power loss
            right after it; costs a flush of the file's pages).
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=_temporary_prefix(path))
    os.close(fd)
    try:
        yield tmp
        if durable:
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Replace the file ``path`` by ``text`` (UTF-8) atomically and durably (:func:`replaced_atomically`)."""
    with replaced_atomically(path, durable=True) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(text)


def leftover_temporaries(path: str | os.PathLike) -> list[Path]:
    """The temporary files of :func:`replaced_atomically` for ``path`` that are on disk now: a process
    killed (SIGKILL, power loss) inside the block leaves its one behind. Only the sole writer of
    ``path`` should delete them: another writer's may be in use."""
    path = Path(path)
    return sorted(path.parent.glob(f"{glob.escape(_temporary_prefix(path))}*"))


def _temporary_prefix(path: Path) -> str:
    return f".{path.name}.tmp-"
