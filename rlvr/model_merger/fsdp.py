"""Merging a checkpoint of the FSDP2 workers: ``model.pt`` holds the full state dict, gathered on rank 0
when it was written (:func:`rlvr.workers.checkpoint.save_training_state`), so a checkpoint of any
number of ranks reads the same way; this module only reads it."""

from __future__ import annotations

import torch

from rlvr.model_merger.base import BaseModelMerger, MergeError
from rlvr.workers.checkpoint import read_model_state

__all__ = ["FSDPModelMerger"]


class FSDPModelMerger(BaseModelMerger):
    """Merge a checkpoint folder written by ``strategy=fsdp``/``fsdp2`` workers (verl's class name)."""

    def load_state(self) -> dict[str, torch.Tensor]:
        """The state dict in ``<local_dir>/model.pt``.

        Raises:
            MergeError: the file is missing (naming what the folder holds instead: verl's or Megatron's
                shards), truncated or corrupted.
        """
        verl_shards = sorted(p.name for p in self.local_dir.glob("model_world_size_*_rank_*.pt"))
        megatron_shards = sorted(p.name for p in self.local_dir.glob("megatron_tp*_pp*.pt"))
        if not (self.local_dir / "model.pt").is_file() and verl_shards:
            raise MergeError(f"{self.local_dir} holds verl's FSDP shards ({verl_shards[0]}, ...), not an rlvr "
                             "checkpoint (model.pt); merge it with verl's merger, or start rlvr from verl's merged model")
        if not (self.local_dir / "model.pt").is_file() and megatron_shards:
            raise MergeError(f"{self.local_dir} was written by the Megatron workers ({megatron_shards[0]}, ...); "
                             "merge it with --backend megatron")
        try:
            return read_model_state(self.local_dir)
        except (FileNotFoundError, ValueError) as err:
            raise MergeError(str(err)) from None
