"""Random float32 batches for the reference-agreement tests: right padding, optionally an
all-masked row, multi-turn rows with gaps inside the response mask, groups of sizes 3, 2, 2 and 1 (one of them
with all-equal rewards)."""

from __future__ import annotations

import numpy as np
import torch

BATCH, RESP_LEN = 8, 7
INDEX = np.array(["p0", "p0", "p0", "p1", "p1", "p2", "p2", "p3"], dtype=object)


def make_mask(empty_row: bool = False) -> torch.Tensor:
    mask = torch.ones(BATCH, RESP_LEN)
    mask[1, 5:] = 0  # right padding
    mask[2, 2:4] = 0  # multi-turn: a tool-output gap inside the response
    mask[2, 6:] = 0
    mask[4, 3:] = 0
    mask[6, 1:3] = 0  # another gap
    mask[7, 4:] = 0
    if empty_row:
        mask[3] = 0  # a padding row added to balance a micro-batch
    return mask


def last_valid(mask: torch.Tensor) -> list[int]:
    return [int(row.nonzero().max()) for row in mask]


def make_outcome_rewards(generator: torch.Generator, mask: torch.Tensor) -> torch.Tensor:
    """Scalar reward on the last valid token; group p2 (rows 5, 6) gets all-equal rewards."""
    scores = torch.rand(BATCH, generator=generator) * 2 - 0.5
    scores[6] = scores[5]
    rewards = torch.zeros(BATCH, RESP_LEN)
    for i, t in enumerate(last_valid(mask)):
        rewards[i, t] = scores[i]
    return rewards


def make_log_probs(generator: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    return -torch.rand(BATCH, RESP_LEN, generator=generator) * 3 * scale


def as_lists(*tensors: torch.Tensor):
    return [t.double().tolist() for t in tensors]
