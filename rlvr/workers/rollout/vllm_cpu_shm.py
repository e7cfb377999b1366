"""Shared-memory names of vLLM's CPU tensor-parallel groups, one set per run.

On CPU, vLLM's tensor-parallel communicator exchanges tensors through POSIX shared memory named
``<ident>-<group>-[ranks]-cpushm_<rank>``, where ``<ident>`` comes from the distributed init method.
Under the ``external_launcher`` executor (rlvr's in-process engines over the workers' group) that
method is always ``env://``, so every run on a machine asks for the same names, and vLLM never removes
them when the process ends: the next run's engine then fails with ``create shm in SHMManager failed.
errno: 17`` (the name exists). Two remedies, both here:

- :func:`unique_cpu_shm_names` puts the group's ``MASTER_PORT`` (the same on every rank of one group,
  different for groups that run at once on a machine) into the names;
- :func:`release_cpu_shm_names` removes the group's names once the engine is up (every rank has
  mapped every segment by then: the engine's start runs collectives after the segments are joined,
  and a mapping outlives its name), so a run that is killed later leaves nothing behind.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["unique_cpu_shm_names", "release_cpu_shm_names", "SHM_TAG"]

SHM_TAG = "rlvr-vllm-tp"
_SHM_DIR = Path("/dev/shm")


def _tag() -> str:
    """This group's part of the names: rlvr's tag and the group's rendezvous port."""
    return f"{SHM_TAG}{os.environ.get('MASTER_PORT', '0')}-"  # the dash: port 2951 is not a prefix of 29511


def unique_cpu_shm_names() -> bool:
    """Make vLLM's CPU shared-memory names carry :func:`_tag` (idempotent); False when this vLLM has no
    CPU shared-memory communicator to name (a CUDA build, or another layout)."""
    try:
        from vllm.distributed.device_communicators import cpu_communicator
    except ImportError:
        return False
    shm = getattr(cpu_communicator, "_CPUSHMDistributed", None)
    if shm is None or not hasattr(shm, "make_group_name"):
        return False
    if getattr(shm, "_rlvr_named", False):
        return True
    vllm_name = shm.make_group_name

    def make_group_name(communicator) -> str:
        return f"{_tag()}{vllm_name(communicator).replace('/', '')}"  # env:// gives the ident "//"

    shm.make_group_name = staticmethod(make_group_name)
    shm._rlvr_named = True
    return True


def release_cpu_shm_names(folder: Path = _SHM_DIR) -> list[str]:
    """Remove this group's shared-memory names (the segments stay mapped in every process that uses
    them; each rank may call it, a name already gone is skipped); returns the names removed."""
    if not folder.is_dir():
        return []
    removed = []
    for path in folder.glob(f"{_tag()}*-cpushm_*"):
        path.unlink(missing_ok=True)
        removed.append(path.name)
    return removed
