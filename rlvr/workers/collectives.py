"""All-reduce helpers over a worker group's data-parallel ranks.

With one rank (the local backend, or a Ray group of one) no process group exists and every helper
returns its input unchanged, so the same code runs sharded and unsharded.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["all_reduce_max", "all_reduce_sum"]


def _all_reduce(value: torch.Tensor, world_size: int, op: dist.ReduceOp, group=None) -> torch.Tensor:
    if world_size == 1:
        return value
    out = value.clone()
    dist.all_reduce(out, op=op, group=group)
    return out


def all_reduce_sum(value: torch.Tensor, world_size: int, group=None) -> torch.Tensor:
    """Sum of ``value`` over the data-parallel group (identity when ``world_size == 1``; ``group``:
    a process group of ``world_size`` ranks, None for the default group)."""
    return _all_reduce(value, world_size, dist.ReduceOp.SUM, group)


def all_reduce_max(value: torch.Tensor, world_size: int) -> torch.Tensor:
    """Maximum of ``value`` over the data-parallel group (identity when ``world_size == 1``)."""
    return _all_reduce(value, world_size, dist.ReduceOp.MAX)
