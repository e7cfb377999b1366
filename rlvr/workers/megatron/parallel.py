"""The parallel layout of a Megatron worker: tensor x context x pipeline x data parallel ranks and their groups.

Every rank of ``torch.distributed``'s default group (``tp * cp * pp * dp`` ranks) is placed by
megatron-core's ``parallel_state`` in its default order ``tp-cp-ep-dp-pp``: the tensor-parallel rank
varies fastest, the pipeline stage slowest, so
``rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))``. The ``cp`` ranks of a
context-parallel group hold the same rows and weights and split every sequence
(:mod:`~rlvr.workers.megatron.context_parallel`).
A mixture-of-experts model's experts have a layout of their own over the same ranks of a stage
(megatron-core's expert groups): ``etp`` expert-tensor-parallel ranks cut every expert, ``ep``
expert-parallel ranks hold different experts, ``edp = tp * cp * dp / (etp * ep)`` expert-data-parallel
ranks hold the same ones.
``parallel_state`` is global to the process: every Megatron role living in one process (actor,
reference, critic colocated) shares one layout, which the config check enforces.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from megatron.core import parallel_state, tensor_parallel

from rlvr.workers.megatron.context_parallel import ContextParallel
from rlvr.workers.megatron.cpu_shims import apply_cpu_shims, apply_te_absent_shim

__all__ = ["MegatronParallel", "init_megatron_parallel", "broadcast_rng_state"]


@dataclass(frozen=True)
class MegatronParallel:
    """This rank's place in the layout and the process groups (None where a group has one rank).

    Attributes:
        tp, pp, dp: tensor-parallel, pipeline and data-parallel sizes.
        tp_rank, pp_rank, dp_rank: this rank's coordinates.
        tp_group, pp_group, dp_group, mp_group: groups of this rank's tensor-parallel peers, its
            pipeline, its data-parallel peers and its model-parallel (tensor x pipeline) peers.
        prev_rank, next_rank, last_stage_rank: global ranks of the previous and next pipeline stage
            and of the last stage of this pipeline.
        embedding_group: the first and last stage of this pipeline (tied embeddings with ``pp > 1``).
        cp, cp_rank, cp_group: context-parallel size, this rank's place in its group and the group.
        dp_cp_group: the data- and context-parallel peers (gradients are summed over context-parallel
            ranks and averaged over data-parallel ones in one all-reduce).
        ep, etp, ep_rank, etp_rank, edp_rank: expert-parallel and expert-tensor-parallel sizes and this
            rank's coordinates in them and among the ranks holding the same experts (1 and 0 for a dense model).
        ep_group, etp_group, edp_group, expert_mp_group: groups of this rank's expert-parallel peers,
            expert-tensor-parallel peers, expert-data-parallel peers (the same experts) and the ranks
            that together hold every expert of every stage (expert-tensor x expert x pipeline).
    """

    tp: int
    pp: int
    dp: int
    tp_rank: int
    pp_rank: int
    dp_rank: int
    tp_group: object
    pp_group: object
    dp_group: object
    mp_group: object
    embedding_group: object
    prev_rank: int
    next_rank: int
    last_stage_rank: int
    cp: int = 1
    cp_rank: int = 0
    cp_group: object = None
    dp_cp_group: object = None
    ep: int = 1
    etp: int = 1
    ep_rank: int = 0
    etp_rank: int = 0
    edp_rank: int = 0
    ep_group: object = None
    etp_group: object = None
    edp_group: object = None
    expert_mp_group: object = None

    @property
    def edp(self) -> int:
        """Expert-data-parallel ranks: the ranks of a stage holding the same experts."""
        return self.tp * self.cp * self.dp // (self.etp * self.ep)

    @property
    def first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def last_stage(self) -> bool:
        return self.pp_rank == self.pp - 1

    @property
    def mp_rank(self) -> int:
        """This rank's index among its model-parallel peers (0 on the first stage's first TP rank)."""
        return self.tp_rank + self.tp * self.pp_rank

    @property
    def context(self) -> ContextParallel:
        """The context-parallel group of this rank."""
        return ContextParallel(self.cp, self.cp_rank, self.cp_group)

    @staticmethod
    def coordinates(rank: int, tp: int, pp: int, world: int, cp: int = 1) -> tuple[int, int, int, int]:
        """``(tp_rank, cp_rank, dp_rank, pp_rank)`` of global ``rank`` (megatron's default order)."""
        dp = world // (tp * cp * pp)
        return rank % tp, (rank // tp) % cp, (rank // (tp * cp)) % dp, rank // (tp * cp * dp)


def _group(size: int, group):
    return group if size > 1 else None


def init_megatron_parallel(tp: int, pp: int, device: str, seed: int, timeout_s: float, cp: int = 1, ep: int = 1,
                           etp: int = 1) -> MegatronParallel:
    """Build megatron-core's process groups over the default group (once per process) and apply the
    CPU shims on CPU; returns this rank's :class:`MegatronParallel`.

    Args:
        cp: context-parallel size.
        ep, etp: expert-parallel and expert-tensor-parallel sizes (a mixture-of-experts model).

    Raises:
        RuntimeError: ``torch.distributed`` is not initialised, the world does not split into
            ``tp x cp x pp`` blocks or a stage's ranks into ``etp x ep`` blocks, or another role of
            this process set up another layout.
    """
    if not dist.is_initialized():
        raise RuntimeError("the Megatron worker needs torch.distributed; the worker initialises it in _setup()")
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % (tp * cp * pp):
        raise RuntimeError(f"{world} ranks do not split into tensor_model_parallel_size={tp} x "
                           f"context_parallel_size={cp} x pipeline_model_parallel_size={pp} blocks")
    if (world // pp) % (etp * ep):
        raise RuntimeError(f"the {world // pp} ranks of a pipeline stage do not split into expert_tensor_parallel_size="
                           f"{etp} x expert_model_parallel_size={ep} blocks")
    if parallel_state.model_parallel_is_initialized():
        have = (parallel_state.get_tensor_model_parallel_world_size(),
                parallel_state.get_pipeline_model_parallel_world_size(),
                parallel_state.get_context_parallel_world_size(),
                parallel_state.get_expert_model_parallel_world_size(),
                parallel_state.get_expert_tensor_parallel_world_size())
        if have != (tp, pp, cp, ep, etp):
            raise RuntimeError(f"this process already runs a Megatron role with (tensor, pipeline, context, expert, "
                               f"expert tensor) parallel sizes {have}; every Megatron role of a process must use the "
                               f"same sizes, got {(tp, pp, cp, ep, etp)}")
    else:
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, context_parallel_size=cp,
            expert_model_parallel_size=ep, expert_tensor_parallel_size=etp, distributed_timeout_minutes=max(1, math.ceil(timeout_s / 60)), create_gloo_process_groups=False,
        )
        if device.startswith("cuda"):  # megatron's CUDA RNG states, which attention's dropout forks
            tensor_parallel.model_parallel_cuda_manual_seed(seed)
        else:
            apply_cpu_shims(seed + 2718 + parallel_state.get_tensor_model_parallel_rank())
        apply_te_absent_shim()
    tp_rank, cp_rank, dp_rank, pp_rank = MegatronParallel.coordinates(rank, tp, pp, world, cp)
    ps = parallel_state
    if (tp_rank, cp_rank, dp_rank, pp_rank) != (ps.get_tensor_model_parallel_rank(), ps.get_context_parallel_rank(),
                                                ps.get_data_parallel_rank(), ps.get_pipeline_model_parallel_rank()):
        raise RuntimeError("megatron-core placed the ranks in another order than rlvr expects (tp-cp-ep-dp-pp)")
    dp = world // (tp * cp * pp)
    return MegatronParallel(
        tp=tp, pp=pp, dp=dp, tp_rank=tp_rank, pp_rank=pp_rank, dp_rank=dp_rank,
        tp_group=_group(tp, ps.get_tensor_model_parallel_group()),
        pp_group=_group(pp, ps.get_pipeline_model_parallel_group()),
        dp_group=_group(dp, ps.get_data_parallel_group()),
        mp_group=_group(tp * pp, ps.get_model_parallel_group()),
        embedding_group=_group(pp, ps.get_embedding_group()),
        prev_rank=ps.get_pipeline_model_parallel_prev_rank(), next_rank=ps.get_pipeline_model_parallel_next_rank(),
        last_stage_rank=ps.get_pipeline_model_parallel_last_rank(),
        cp=cp, cp_rank=cp_rank, cp_group=_group(cp, ps.get_context_parallel_group()),
        dp_cp_group=_group(dp * cp, ps.get_data_parallel_group(with_context_parallel=True)),
        ep=ep, etp=etp, ep_rank=ps.get_expert_model_parallel_rank(), etp_rank=ps.get_expert_tensor_parallel_rank(),
        edp_rank=ps.get_expert_data_parallel_rank(),
        ep_group=_group(ep, ps.get_expert_model_parallel_group()),
        etp_group=_group(etp, ps.get_expert_tensor_parallel_group()),
        edp_group=_group(tp * cp * dp // (etp * ep), ps.get_expert_data_parallel_group()),
        expert_mp_group=_group(etp * ep * pp, ps.get_expert_tensor_model_pipeline_parallel_group()),
    )


def broadcast_rng_state(parallel: MegatronParallel) -> None:
    """Give every rank that shares the data (context-parallel and model-parallel peers) the CPU (and
    CUDA) RNG state of its model's first rank, so that random choices made on the data (the mini-batch
    shuffle, LoRA's dropout masks) agree across them: context-parallel rank 0's state to its group,
    then model-parallel rank 0's."""
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    for group in (parallel.cp_group, parallel.mp_group):
        if group is None:
            continue
        state = [torch.get_rng_state(), torch.cuda.get_rng_state() if cuda else None]
        dist.broadcast_object_list(state, src=dist.get_global_rank(group, 0), group=group)
        torch.set_rng_state(state[0])
        if cuda:
            torch.cuda.set_rng_state(state[1])
