"""Where the in-process rollout engines sit among a worker group's ranks (``rollout.mode=sync``).

Every ``tensor_model_parallel_size`` consecutive ranks of the group hold one engine between them
(verl's layout); with ``tp = 1`` every rank holds its own (data-parallel engines). The group's
dispatch hands every rank its own part of a batch (``DP_COMPUTE_PROTO``), so the ranks of one engine
first exchange their parts (:meth:`RolloutPlacement.gather`): each then runs the same rows through the
same engine calls (vLLM's ``external_launcher`` executor expects every rank of a tensor-parallel group
to issue the same requests with the same seeds), and keeps the rows it was given
(:meth:`RolloutPlacement.own`). The engines of a group get different sampling seeds, the ranks of
one engine the same (:meth:`RolloutPlacement.engine_seed`).
"""

from __future__ import annotations

import torch.distributed as dist

from rlvr.protocol import DataProto

__all__ = ["RolloutPlacement"]

SEED_STRIDE = 1_000_003
"""Distance between the sampling seeds of two engines (a prime: the seeds of engines never coincide)."""


class RolloutPlacement:
    """This rank's engine: ranks ``engine x tp ... engine x tp + tp - 1`` of the group hold it.

    Args:
        tp: ranks per engine (``rollout.tensor_model_parallel_size``).
        rank, world: this rank and the group's size (``world`` a multiple of ``tp``).

    Building it with ``tp > 1`` is a collective over the default process group: every rank makes
    every engine's gloo group, in the same order.
    """

    def __init__(self, tp: int, rank: int, world: int) -> None:
        if tp < 1 or world % tp:
            raise ValueError(f"{world} rollout workers do not split into engines of tensor_model_parallel_size={tp}")
        self.tp, self.rank, self.world = tp, rank, world
        self.engine, self.tp_rank = divmod(rank, tp)
        self.group = None
        if tp > 1:
            for engine in range(world // tp):
                group = dist.new_group(list(range(engine * tp, (engine + 1) * tp)), backend="gloo")
                if engine == self.engine:
                    self.group = group

    @property
    def num_engines(self) -> int:
        return self.world // self.tp

    def engine_seed(self, seed: int, rollout_seed: int | None = None) -> int:
        """The sampling seed of this rank's engine (the same on every rank of the engine): verl's
        ``rollout.seed`` + engine when it is set, else one derived from ``seed`` (``trainer.seed``)
        with :data:`SEED_STRIDE` between engines."""
        if rollout_seed is not None:
            return int(rollout_seed) + self.engine
        return int(seed) + SEED_STRIDE * (self.engine + 1)

    def gather(self, data: DataProto) -> tuple[DataProto, list[int]]:
        """The rows of every rank of this engine (rank order) and the row count of each; ``data`` itself
        with one rank per engine."""
        if self.group is None:
            return data, [len(data)]
        parts: list[DataProto | None] = [None] * self.tp
        dist.all_gather_object(parts, data, group=self.group)
        return DataProto.concat(parts), [len(part) for part in parts]

    def own(self, data: DataProto, counts: list[int]) -> DataProto:
        """This rank's rows of an output over :meth:`gather`'s rows (``counts`` from it)."""
        if self.group is None:
            return data
        start = sum(counts[: self.tp_rank])
        return data.slice(start, start + counts[self.tp_rank])
