"""Checkpoint directories of a run: atomic writes, the latest one, keeping the last k.

Layout under ``<run dir>/checkpoints``::

    global_step_<k>/
        actor/              written by the actor workers' save_checkpoint (model, optimizer, scheduler)
        critic/             the critic's, when there is one
        trainer_state.pt    driver state: step, data position, RNG states, KL controller
    latest_checkpointed_iteration.txt

A checkpoint is first written to ``global_step_<k>.tmp`` and renamed when complete, so a crash
while saving never leaves a directory that looks finished.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch

TRAINER_STATE_FILE = "trainer_state.pt"
LATEST_FILE = "latest_checkpointed_iteration.txt"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")


class CheckpointManager:
    """Find, write and prune the checkpoints of one run.

    Args:
        root: the checkpoint folder (``<run dir>/checkpoints``).
        max_to_keep: keep only the newest k complete checkpoints (None = all).
    """

    def __init__(self, root: str | os.PathLike, max_to_keep: int | None = None) -> None:
        self.root = Path(root)
        self.max_to_keep = max_to_keep

    def step_dir(self, step: int) -> Path:
        return self.root / f"global_step_{step}"

    def steps(self) -> list[int]:
        """Steps of the complete checkpoints, ascending."""
        if not self.root.is_dir():
            return []
        found = (_STEP_DIR.match(p.name) for p in self.root.iterdir() if p.is_dir())
        return sorted(int(m.group(1)) for m in found if m and (self.root / m.group(0) / TRAINER_STATE_FILE).is_file())

    def latest(self) -> Path | None:
        """The newest complete checkpoint, or None."""
        steps = self.steps()
        return self.step_dir(steps[-1]) if steps else None

    def begin(self, step: int) -> Path:
        """A fresh temporary directory for the checkpoint of ``step`` (removed first if left over)."""
        tmp = self.root / f"global_step_{step}.tmp"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        return tmp

    def commit(self, tmp: Path, step: int, trainer_state: dict[str, Any]) -> Path:
        """Write the driver state into ``tmp``, rename it to ``global_step_<step>`` and prune old ones."""
        torch.save(trainer_state, tmp / TRAINER_STATE_FILE)
        final = self.step_dir(step)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        latest_tmp = self.root / f"{LATEST_FILE}.tmp"
        latest_tmp.write_text(str(step))
        os.replace(latest_tmp, self.root / LATEST_FILE)
        self._prune()
        return final

    def _prune(self) -> None:
        if self.max_to_keep is None:
            return
        for step in self.steps()[:-self.max_to_keep]:
            shutil.rmtree(self.step_dir(step))

    @staticmethod
    def load_trainer_state(path: str | os.PathLike) -> dict[str, Any]:
        """The driver state saved in checkpoint directory ``path``."""
        file = Path(path) / TRAINER_STATE_FILE
        if not file.is_file():
            raise FileNotFoundError(f"{path} is not a complete rlvr checkpoint (no {TRAINER_STATE_FILE}); "
                                    "point trainer.resume_from_path at a global_step_<k> directory")
        return torch.load(file, weights_only=False)
