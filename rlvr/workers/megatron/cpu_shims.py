"""The CUDA assumptions of megatron-core that rlvr works around on CPU, in one place.

Checked on megatron-core 0.16.1 (``SUPPORTED_VERSIONS``; ``tests/megatron/test_cpu_shims.py`` fails
when an installed version changes one of the sites below). Applied by
:func:`~rlvr.workers.megatron.parallel.init_megatron_parallel` on CPU only, after
``parallel_state.initialize_model_parallel``; nothing in megatron's files is edited.

Patched on CPU (two process-global objects and four functions are replaced by CPU versions):

1. ``tensor_parallel.random``'s RNG tracker keeps *CUDA* generator states (``add`` seeds with
   ``torch.cuda.manual_seed``, ``fork`` swaps ``torch.cuda`` states). Attention forks it around its
   dropout on every forward, even with dropout 0. :class:`CpuRNGStatesTracker` keeps CPU generator
   states instead, seeded per tensor-parallel rank like megatron's ``model-parallel-rng``.
2. ``parallel_state``'s global memory buffer (the scratch tensor that attention's ``baddbmm``
   writes its scores into) allocates on ``torch.cuda.current_device()``. :class:`CpuMemoryBuffer`
   allocates on the CPU.
3. Activation recompute (``recompute_granularity``: ``model.enable_gradient_checkpointing`` or
   ``megatron.override_transformer_config``) saves and restores the CUDA generator state around each
   recomputed layer (``_get_cuda_rng_state`` / ``_set_cuda_rng_state`` of ``tensor_parallel.random``).
   On CPU there is no CUDA generator: the CPU state, which megatron saves and restores beside it,
   and the tracker's states (shim 1) are all there is, so the CUDA state is an empty tensor.
4. ``tensor_parallel.mappings``' all-gather and reduce-scatter along the first dimension allocate
   their outputs on ``torch.cuda.current_device()``; a mixture-of-experts layer's ``allgather``
   token dispatcher reaches both on every forward with expert parallelism.
   :func:`gather_along_first_dim` and :func:`reduce_scatter_along_first_dim` do the same collectives
   (``all_gather_into_tensor`` / ``reduce_scatter_tensor``, which torch 2.13's gloo has) on the
   input's device.

Patched on every device (megatron-core without transformer-engine, which rlvr's local layer spec
does not need):

5. ``transformer.moe.moe_utils`` imports ``te_general_gemm`` from transformer-engine and leaves the
   name undefined when that import fails, yet the MoE router's gating reads it on every forward
   (``NameError``). :func:`apply_te_absent_shim` defines it as None, the value its code tests for.

The MoE router's ``gating`` moves a CPU router weight to ``torch.cuda.current_device()`` on every
call: rlvr's layer spec builds the router as :class:`~rlvr.workers.megatron.moe.RlvrTopKRouter`,
whose gating leaves the weight where it is (no patch).

Avoided (rlvr never reaches these sites, so nothing is patched):

6. ``RotaryEmbedding`` moves its ``inv_freq`` to ``torch.cuda.current_device()``: rlvr builds the
   ``GPTModel`` with ``position_embedding_type="none"`` and passes the rotary angles of each row's
   ``position_ids`` itself (also needed to match Hugging Face on left-padded batches).
7. ``FusedScaleMaskSoftmax`` builds its default causal mask on CUDA: rlvr always passes a mask.
8. With pipeline stages and tied embeddings, ``GPTModel`` copies the embedding to the last stage
   through ``.cuda()``: rlvr builds that stage with an untied head, loads the embedding into it and
   sums the two gradients itself (:mod:`rlvr.workers.megatron.grads`).

Not usable on CPU without editing megatron's files (19 ``device="cuda"`` lines in 5 files in
0.16.1): its ``DistributedDataParallel``, its optimizer (gradient clipping) and its pipeline
schedules. rlvr uses its own update loop and pipeline send/receive on every device instead
(``docs/megatron.md`` explains the choice).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.tensor_parallel import mappings as megatron_mappings
from megatron.core.tensor_parallel import random as megatron_random
from megatron.core.transformer.moe import moe_utils as megatron_moe_utils
from megatron.core.utils import GlobalMemoryBuffer

__all__ = ["SUPPORTED_VERSIONS", "CpuRNGStatesTracker", "CpuMemoryBuffer", "apply_cpu_shims", "apply_te_absent_shim",
           "gather_along_first_dim", "reduce_scatter_along_first_dim"]

SUPPORTED_VERSIONS = ">=0.16.1,<0.17"
"""The megatron-core versions whose sites these shims were checked on (the ``rlvr[megatron]`` pin)."""

MODEL_PARALLEL_RNG = "model-parallel-rng"
"""Megatron's name of the per-tensor-parallel-rank generator that attention's dropout forks."""


class CpuRNGStatesTracker(megatron_random.CudaRNGStatesTracker):
    """Megatron's named RNG states, kept as CPU generator states (shim 1)."""

    def add(self, name: str, seed: int) -> None:
        """Track a new CPU generator state seeded with ``seed`` under ``name``."""
        if seed in self.seeds_:
            raise ValueError(f"RNG seed {seed} is already tracked")
        if name in self.states_:
            raise ValueError(f"RNG state {name!r} is already tracked")
        self._is_initialized = True
        self.seeds_.add(seed)
        self.states_[name] = torch.Generator().manual_seed(seed).get_state()

    @contextlib.contextmanager
    def fork(self, name: str = MODEL_PARALLEL_RNG) -> Iterator[None]:
        """Run the block on the CPU generator state ``name``, then restore the caller's state."""
        if name not in self.states_:
            raise KeyError(f"RNG state {name!r} is not tracked")
        outer = torch.get_rng_state()
        torch.set_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(outer)


class CpuMemoryBuffer(GlobalMemoryBuffer):
    """Megatron's reusable scratch tensors, allocated on the CPU (shim 2)."""

    def get_tensor(self, tensor_shape, dtype, name, mem_alloc_context=None) -> torch.Tensor:
        """A ``tensor_shape`` view of the buffer ``(name, dtype)``, grown on the CPU when too small."""
        needed = 1
        for size in tensor_shape:
            needed *= size
        key = (name, dtype)
        if key not in self.buffer or self.buffer[key].numel() < needed:
            self.buffer[key] = torch.empty(needed, dtype=dtype, requires_grad=False)
        return self.buffer[key][:needed].view(*tensor_shape)


def gather_along_first_dim(input_: torch.Tensor, group, output_split_sizes=None, use_global_buffer=False
                           ) -> torch.Tensor:
    """Every rank's ``input_`` stacked along dim 0 (equal sizes, or ``output_split_sizes`` rows from each
    rank), allocated on the input's device (shim 4; ``use_global_buffer`` is a CUDA memory saving)."""
    size = group.size()
    if size == 1:
        return input_
    input_ = input_.contiguous()
    if output_split_sizes is None:
        out = input_.new_empty((input_.shape[0] * size, *input_.shape[1:]))
        dist.all_gather_into_tensor(out, input_, group=group)
        return out
    out = input_.new_empty((sum(output_split_sizes), *input_.shape[1:]))
    dist.all_gather(list(out.split(list(output_split_sizes))), input_, group=group)
    return out


def reduce_scatter_along_first_dim(input_: torch.Tensor, group, input_split_sizes=None, use_global_buffer=False
                                   ) -> torch.Tensor:
    """This rank's part of ``input_`` summed over the group (equal parts along dim 0, or
    ``input_split_sizes`` rows per rank), allocated on the input's device (shim 4)."""
    size = group.size()
    if size == 1:
        return input_
    if input_split_sizes is None:
        out = input_.new_empty((input_.shape[0] // size, *input_.shape[1:]))
        dist.reduce_scatter_tensor(out, input_.contiguous(), group=group)
        return out
    parts = [part.contiguous() for part in input_.split(list(input_split_sizes))]
    out = torch.empty_like(parts[group.rank()])
    dist.reduce_scatter(out, parts, group=group)
    return out


def apply_cpu_shims(model_parallel_seed: int) -> None:
    """Install shims 1-4 (after ``initialize_model_parallel``, which creates the buffer).

    Args:
        model_parallel_seed: seed of this tensor-parallel rank's ``model-parallel-rng`` state.
    """
    tracker = CpuRNGStatesTracker()
    tracker.add(MODEL_PARALLEL_RNG, model_parallel_seed)
    megatron_random._CUDA_RNG_STATE_TRACKER = tracker
    megatron_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    parallel_state._GLOBAL_MEMORY_BUFFER = CpuMemoryBuffer()
    megatron_random._get_cuda_rng_state = _no_cuda_rng_state
    megatron_random._set_cuda_rng_state = _set_no_cuda_rng_state
    megatron_mappings._gather_along_first_dim = gather_along_first_dim
    megatron_mappings._reduce_scatter_along_first_dim = reduce_scatter_along_first_dim


def apply_te_absent_shim() -> None:
    """Install shim 5 when transformer-engine is not installed (any device)."""
    if not megatron_moe_utils.HAVE_TE:
        megatron_moe_utils.te_general_gemm = None


def _no_cuda_rng_state(*args, **kwargs) -> torch.Tensor:
    """Shim 3: the CUDA generator state of a process without CUDA (nothing to save)."""
    return torch.empty(0, dtype=torch.uint8)


def _set_no_cuda_rng_state(new_state: torch.Tensor, *args, **kwargs) -> None:
    """Shim 3: restoring the (empty) CUDA generator state of a process without CUDA."""
    return None
