"""The policy's weights as a Hugging Face folder that server replicas load from disk.

Server replicas live in other processes (or on other machines that share the folder), so the
trainer writes the weights once per update, ``model.safetensors`` and ``config.json`` in a folder
named after the version, and every replica reloads from it. The folder is written under a
temporary name and renamed when complete, so a replica never reads half a checkpoint; older
versions are removed once a newer one is complete. Names are the checkpoint names vLLM loads
(:class:`~rlvr.workers.rollout.vllm_weights.PolicyWeightNames`: LoRA merged, a tied LM head written
under its own name too).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors.torch import save_file

__all__ = ["WeightsFolder", "write_checkpoint"]


def write_checkpoint(folder: Path, named_tensors: Iterable[tuple[str, torch.Tensor]], hf_config) -> None:
    """``model.safetensors`` (the tensors as they are, on CPU) and ``config.json`` in ``folder``."""
    tensors: dict[str, torch.Tensor] = {}
    storages: set[int] = set()
    for name, tensor in named_tensors:
        tensor = tensor.detach().to("cpu")
        if tensor.untyped_storage().data_ptr() in storages:  # safetensors refuses shared storage (tied weights)
            tensor = tensor.clone()
        storages.add(tensor.untyped_storage().data_ptr())
        tensors[name] = tensor.contiguous()
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    hf_config.to_json_file(str(folder / "config.json"))


class WeightsFolder:
    """Versioned weight folders under one root.

    Args:
        root: the folder (created if missing); every replica must read it at this path.
        hf_config: the policy's transformers config (written as ``config.json``).
    """

    def __init__(self, root: str | Path, hf_config) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.hf_config = hf_config
        self.current: Path | None = None

    def path_of(self, version: int) -> Path:
        return self.root / f"weights-v{version}"

    def write(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> Path:
        """Write the weights of ``version``; returns its folder (the old versions are removed).

        Args:
            named_tensors: ``(checkpoint name, tensor)`` pairs (any device and dtype; written as they are).
            version: the weights version.
        """
        final = self.path_of(version)
        partial = self.root / f".partial-weights-v{version}"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        write_checkpoint(partial, named_tensors, self.hf_config)
        shutil.rmtree(final, ignore_errors=True)
        partial.rename(final)
        for old in self.root.glob("weights-v*"):
            if old != final:
                shutil.rmtree(old, ignore_errors=True)
        self.current = final
        return final
