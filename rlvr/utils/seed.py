"""Seeding and RNG state capture, so that a resumed run continues exactly as the uninterrupted one."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

__all__ = ["set_seed", "get_rng_state", "set_rng_state"]


def set_seed(seed: int) -> None:
    """Seed python's ``random``, numpy's global RNG, torch on the CPU and every CUDA device."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def get_rng_state() -> dict[str, Any]:
    """Snapshot of every global RNG (python, numpy, torch CPU, and CUDA when present).

    The result pickles (``torch.save``) and goes back in through :func:`set_rng_state`.
    """
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore the RNGs from a :func:`get_rng_state` snapshot.

    Raises:
        KeyError: the snapshot lacks the python, numpy or torch state.
        ValueError: the snapshot holds CUDA states but this process sees a different number of
            CUDA devices (resume with the same device layout).
    """
    missing = [key for key in ("python", "numpy", "torch") if key not in state]
    if missing:
        raise KeyError(f"RNG state snapshot lacks {missing}; it must come from rlvr.utils.seed.get_rng_state()")
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    cuda_states = state.get("cuda")
    if cuda_states is None:
        return
    devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if len(cuda_states) != devices:
        raise ValueError(
            f"RNG state snapshot holds {len(cuda_states)} CUDA state(s) but this process sees {devices} "
            "CUDA device(s); resume with the same devices per process"
        )
    torch.cuda.set_rng_state_all(cuda_states)
