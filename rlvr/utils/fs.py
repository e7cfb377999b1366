"""verl's ``verl.utils.fs.copy_to_local``: a model or data location as a local path to load from."""

from __future__ import annotations

import os

from rlvr.utils.model import local_model_dir

__all__ = ["copy_to_local"]


def copy_to_local(src: str, cache_dir: str | None = None, filelock: str = ".file.lock", verbose: bool = False,
                  always_recopy: bool = False, use_shm: bool = False) -> str:
    """A path ``from_pretrained`` loads ``src`` from: a local folder as it is, rlvr's embedded model
    or a GGUF file as its dequantised cache folder, a hub id as it is (transformers fetches it).

    ``cache_dir``, ``filelock``, ``verbose`` and ``always_recopy`` set verl's copies from HDFS, which
    rlvr does not read; ``use_shm`` (verl's copy to shared memory, a speed switch) is not needed: the
    files are read where they are.

    Raises:
        ValueError: an ``hdfs://`` source (copy it to a local folder first).
    """
    if os.fspath(src).startswith("hdfs://"):
        raise ValueError(f"{src}: rlvr reads local folders, GGUF files and hub ids, not HDFS; copy it to a local "
                         "folder first (e.g. `hdfs dfs -get`)")
    return local_model_dir(src)
