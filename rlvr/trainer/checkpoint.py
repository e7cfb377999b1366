"""Checkpoint directories of a run: whole or absent, verified on resume, the last k kept.

Layout under ``<run dir>/checkpoints``::

    global_step_<k>/
        actor/              written by the actor workers' save_checkpoint (model, optimizer, scheduler)
        critic/             the critic's, when there is one
        trainer_state.pt    driver state: step, data position, RNG states, KL controller
        manifest.json       size and SHA-256 of every other file; written last
    latest_checkpointed_iteration.txt

A checkpoint is written into ``global_step_<k>.tmp``; when every file is on disk (fsynced) the
manifest is written, then the folder is renamed (an older ``global_step_<k>`` of the same step is
first renamed aside to ``global_step_<k>.old`` and deleted last, so a crash at any point leaves a
whole copy of step k). A folder without a manifest, or whose files no longer match it (missing,
truncated, altered), is not a checkpoint: resuming skips it with a warning that names the problem
and takes the previous whole one. Leftovers of an interrupted save are tidied at the next save and
at an automatic resume: a ``.tmp`` whose manifest verifies and whose step has no folder yet is
renamed into place (the crash came between the manifest and the rename), every other ``.tmp`` and
``.old`` is deleted. The files can be checked by hand with ``sha256sum``. Keeping the last k never
deletes the newest checkpoint that is whole.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rlvr.utils.files import leftover_temporaries, write_text_atomic
from rlvr.workers.checkpoint import atomic_save

logger = logging.getLogger(__name__)

TRAINER_STATE_FILE = "trainer_state.pt"
MANIFEST_FILE = "manifest.json"
LATEST_FILE = "latest_checkpointed_iteration.txt"
MANIFEST_FORMAT = 1
_STEP_DIR = re.compile(r"^global_step_(\d+)$")
_LEFTOVER = re.compile(r"^global_step_(\d+)\.(tmp|old)$")
_CHUNK = 1 << 20


class CheckpointError(RuntimeError):
    """A checkpoint folder is incomplete or damaged; the message says what is wrong."""


def _sha256_and_sync(path: Path) -> str:
    """SHA-256 of the file, after forcing its bytes to disk."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        os.fsync(f.fileno())
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_manifest(folder: str | os.PathLike, step: int) -> dict[str, Any]:
    """Fsync every file under ``folder`` and record its size and SHA-256 in ``manifest.json``
    (written atomically, last). Returns the manifest."""
    folder = Path(folder)
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST_FILE)
    manifest = {"format": MANIFEST_FORMAT, "step": step,
                "files": {p.relative_to(folder).as_posix(): {"size": p.stat().st_size, "sha256": _sha256_and_sync(p)}
                          for p in files}}
    for sub in {p.parent for p in files}:
        _fsync_dir(sub)
    write_text_atomic(folder / MANIFEST_FILE, json.dumps(manifest, indent=1, sort_keys=True))
    _fsync_dir(folder)
    return manifest


def checkpoint_problem(folder: str | os.PathLike, checksums: bool = True) -> str | None:
    """What is wrong with the checkpoint ``folder``, or None when it is whole.

    Args:
        folder: a ``global_step_<k>`` directory.
        checksums: also compare SHA-256 digests (reads every byte); False checks presence and sizes.
    """
    folder = Path(folder)
    manifest_path = folder / MANIFEST_FILE
    if not manifest_path.is_file():
        return f"no {MANIFEST_FILE} (the save did not finish)"
    try:
        files = json.loads(manifest_path.read_text(encoding="utf-8"))["files"]
    except (ValueError, KeyError, TypeError) as err:
        return f"{MANIFEST_FILE} is unreadable ({err})"
    if TRAINER_STATE_FILE not in files:
        return f"the manifest lists no {TRAINER_STATE_FILE}"
    return _files_problem(folder, files, checksums)


def _files_problem(folder: Path, files: dict[str, Any], checksums: bool) -> str | None:
    """The first of ``files`` (manifest entries: name -> size and SHA-256) that is missing or does not
    match, said in words; None when all match."""
    for name, expected in files.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        size = path.stat().st_size
        if size != expected["size"]:
            return f"{name} has {size} bytes, the manifest says {expected['size']} (truncated or rewritten)"
        if checksums and _sha256(path) != expected["sha256"]:
            return f"{name} does not match its SHA-256 in the manifest (corrupted)"
    return None


def manifest_problem(folder: str | os.PathLike, subfolder: str) -> str | None:
    """What is wrong with the files under ``subfolder`` of the checkpoint ``folder`` (a
    ``global_step_<k>`` directory) against its manifest (sizes and SHA-256), or None when they match
    or the folder has no manifest (nothing to check against). Reads only those files: a tool that
    needs one worker's files (the model merger) need not hash the others."""
    folder = Path(folder)
    manifest_path = folder / MANIFEST_FILE
    if not manifest_path.is_file():
        return None
    try:
        files = json.loads(manifest_path.read_text(encoding="utf-8"))["files"]
    except (ValueError, KeyError, TypeError) as err:
        return f"{MANIFEST_FILE} is unreadable ({err})"
    prefix = f"{subfolder.strip('/')}/"
    return _files_problem(folder, {n: e for n, e in files.items() if n.startswith(prefix)}, checksums=True)


class CheckpointManager:
    """Find, write, verify and prune the checkpoints of one run.

    Args:
        root: the checkpoint folder (``<run dir>/checkpoints``).
        max_to_keep: keep only the newest k whole checkpoints (None = all).
    """

    def __init__(self, root: str | os.PathLike, max_to_keep: int | None = None) -> None:
        self.root = Path(root)
        self.max_to_keep = max_to_keep

    def step_dir(self, step: int) -> Path:
        return self.root / f"global_step_{step}"

    def steps(self) -> list[int]:
        """Steps of the ``global_step_<k>`` folders that have a manifest, ascending (not verified)."""
        if not self.root.is_dir():
            return []
        found = (_STEP_DIR.match(p.name) for p in self.root.iterdir() if p.is_dir())
        return sorted(int(m.group(1)) for m in found if m and (self.root / m.group(0) / MANIFEST_FILE).is_file())

    def latest(self, at_most: int | None = None) -> Path | None:
        """The newest whole checkpoint (checksums verified), or None. Newer folders that are
        unfinished or damaged are skipped with a warning that names the problem.

        Args:
            at_most: consider only steps <= this one.
        """
        for path in self._folders_newest_first(at_most):
            problem = "a save that did not finish" if path.suffix == ".tmp" else checkpoint_problem(path)
            if problem is None:
                return path
            logger.warning("checkpoint %s skipped: %s; falling back to the previous one", path, problem)
        return None

    def _folders_newest_first(self, at_most: int | None) -> list[Path]:
        """``global_step_<k>`` and leftover ``global_step_<k>.tmp`` folders, newest step first."""
        if not self.root.is_dir():
            return []
        found = []
        for path in self.root.iterdir():
            match = _STEP_DIR.match(path.name.removesuffix(".tmp"))
            if match and path.is_dir() and (at_most is None or int(match.group(1)) <= at_most):
                found.append((int(match.group(1)), path.suffix != ".tmp", path))
        return [path for *_, path in sorted(found, reverse=True)]

    def tidy(self) -> None:
        """Clear what interrupted saves left: a ``global_step_<k>.tmp`` that is whole (checksums
        verified) while ``global_step_<k>`` is absent is renamed into place; every other ``.tmp``
        or ``.old`` folder is deleted (a 135M-parameter actor's checkpoint is 1.6 GB), and so is a
        temporary file of :data:`LATEST_FILE` that a kill left. Logged."""
        if not self.root.is_dir():
            return
        for path in sorted(self.root.iterdir()):
            match = _LEFTOVER.match(path.name)
            if not (match and path.is_dir()):
                continue
            final = self.step_dir(int(match.group(1)))
            if match.group(2) == "tmp" and not final.exists() and checkpoint_problem(path) is None:
                os.replace(path, final)
                logger.warning("checkpoint %s: the save was whole but not renamed; renamed to %s", path, final.name)
            else:
                shutil.rmtree(path)
                logger.warning("checkpoint %s: removed what an interrupted save left", path)
        for path in leftover_temporaries(self.root / LATEST_FILE):  # a kill while the step number was written
            path.unlink()
            logger.warning("checkpoint %s: removed what an interrupted save left", path)
        _fsync_dir(self.root)

    def tmp_dir(self, step: int) -> Path:
        """Where the checkpoint of ``step`` is written before :meth:`commit` renames it."""
        return self.root / f"global_step_{step}.tmp"

    def begin(self, step: int) -> Path:
        """A fresh temporary directory for the checkpoint of ``step``, after :meth:`tidy`."""
        self.tidy()
        tmp = self.tmp_dir(step)
        tmp.mkdir(parents=True)
        return tmp

    def commit(self, tmp: Path, step: int, trainer_state: dict[str, Any]) -> Path:
        """Write the driver state and the manifest into ``tmp``, rename it to ``global_step_<step>``,
        record it as the latest and prune old ones. An existing ``global_step_<step>`` is renamed
        aside first and deleted after the rename, so step ``step`` is on disk whole at every instant
        (:meth:`tidy` finishes the job after a crash)."""
        atomic_save(trainer_state, tmp / TRAINER_STATE_FILE)
        write_manifest(tmp, step)
        final = self.step_dir(step)
        aside = final.with_name(f"{final.name}.old")
        if final.exists():
            os.replace(final, aside)
        os.replace(tmp, final)
        write_text_atomic(self.root / LATEST_FILE, str(step))
        _fsync_dir(self.root)
        if aside.exists():
            shutil.rmtree(aside)
        self._prune()
        return final

    def _prune(self) -> None:
        """Delete the checkpoints older than the k-th newest whole one; damaged ones newer than it
        stay (resuming skips them), so the newest whole one always survives.

        "Whole" is judged by the files' presence and sizes, not their SHA-256: hashing every kept
        checkpoint at every save would read k x 1.6 GB for a 135M-parameter actor (about 1 s per
        checkpoint). What sizes miss is a file altered in place after it was written (a bit flip
        on disk): the checkpoint just committed was hashed as it was written, and resuming
        verifies the checksums and falls back past such a file, but pruning may by then have
        deleted the older checkpoint it would fall back to."""
        if self.max_to_keep is None:
            return
        whole = [s for s in self.steps() if checkpoint_problem(self.step_dir(s), checksums=False) is None]
        if len(whole) <= self.max_to_keep:
            return
        oldest_kept = whole[-self.max_to_keep]
        for step in self.steps():
            if step < oldest_kept:
                shutil.rmtree(self.step_dir(step))

    @staticmethod
    def verify(path: str | os.PathLike) -> Path:
        """``path`` if it is a whole checkpoint; else raises :class:`CheckpointError` saying why."""
        path = Path(path)
        problem = checkpoint_problem(path)
        if problem is not None:
            raise CheckpointError(f"{path} is not a whole rlvr checkpoint: {problem}; point "
                                  "trainer.resume_from_path at another global_step_<k> directory, or use "
                                  "trainer.resume_mode=auto to take the newest whole one")
        return path

    @staticmethod
    def load_trainer_state(path: str | os.PathLike) -> dict[str, Any]:
        """The driver state saved in checkpoint directory ``path``."""
        file = Path(path) / TRAINER_STATE_FILE
        if not file.is_file():
            raise CheckpointError(f"{path} is not a complete rlvr checkpoint (no {TRAINER_STATE_FILE}); "
                                  "point trainer.resume_from_path at a global_step_<k> directory")
        return torch.load(file, weights_only=False)


class RunCheckpoints:
    """The checkpoints of one run: whole-state saves and loads through the worker groups, and the
    checkpoints of this run that recovery may go back to.

    A checkpoint holds, for each checkpointed worker group ``name``, the folder ``<name>/`` written
    by the group's ``save_checkpoint`` and its ranks' RNG states, plus the driver state.

    Args:
        root: the checkpoint folder (``<run dir>/checkpoints``).
        max_to_keep: keep only the newest k whole checkpoints (None = all).
    """

    def __init__(self, root: str | os.PathLike, max_to_keep: int | None = None) -> None:
        self.manager = CheckpointManager(root, max_to_keep)
        self.restore_points: list[Path] = []  # written or resumed from by this run, oldest first

    def save(self, step: int, groups: dict[str, Any], driver_state: dict[str, Any], lead: bool = True,
             barrier: Callable[[], None] | None = None, hf_exports: frozenset[str] = frozenset()) -> Path:
        """Write ``global_step_<step>``: every group's state and RNG states, the driver state, the manifest.

        Args:
            lead: this process does the driver's file work (False on the other processes of a torchrun
                job, which run the same driver code: they make only the worker calls).
            barrier: lines a torchrun job's processes up around the lead's file work (None: one driver).
            hf_exports: the groups that also write their model as a Hugging Face folder
                ``<name>/huggingface`` (verl's ``checkpoint.save_contents`` with ``hf_model``).
        """
        tmp = self.manager.begin(step) if lead else self.manager.tmp_dir(step)
        if barrier is not None:
            barrier()
        worker_rng = {}
        for name, group in groups.items():
            group.save_checkpoint(str(tmp / name))
            if name in hf_exports:
                group.export_hf(str(tmp / name / "huggingface"))
            worker_rng[name] = group.get_rng_state()
        path = self.manager.commit(tmp, step, {**driver_state, "worker_rng": worker_rng}) if lead \
            else self.manager.step_dir(step)
        if barrier is not None:
            barrier()
        self.restore_points.append(path)
        return path

    def load(self, path: Path, groups: dict[str, Any]) -> dict[str, Any]:
        """Restore every group (state and RNG states) from ``path``; returns the driver state."""
        state = CheckpointManager.load_trainer_state(path)
        for name, group in groups.items():
            group.load_checkpoint(str(path / name))
            group.set_rng_state(state["worker_rng"][name])
        if path not in self.restore_points:
            self.restore_points.append(path)
        return state

    def to_resume(self, resume_mode: str, resume_from_path: str | None) -> Path | None:
        """The checkpoint ``trainer.resume_mode`` asks for: None (``disable``, or nothing saved yet),
        the newest whole one (``auto``, damaged ones skipped with a warning) or ``resume_from_path``
        (``resume_path``; it must be whole)."""
        if resume_mode == "disable":
            return None
        if resume_mode == "resume_path":
            return CheckpointManager.verify(resume_from_path)
        self.manager.tidy()
        return self.manager.latest()

    def last_whole(self) -> Path | None:
        """The newest whole checkpoint this run wrote or resumed from (damaged ones are skipped
        with a warning; pruned ones are gone), or None."""
        for path in reversed([p for p in self.restore_points if p.exists()]):
            problem = checkpoint_problem(path)
            if problem is None:
                return path
            logger.warning("checkpoint %s skipped: %s; falling back to the previous one", path, problem)
        return None

