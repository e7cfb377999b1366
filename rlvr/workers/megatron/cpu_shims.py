"""The CUDA assumptions of megatron-core that rlvr works around on CPU, in one place.

Checked on megatron-core 0.16.1 (``SUPPORTED_VERSIONS``; ``tests/megatron/test_cpu_shims.py`` fails
when an installed version changes one of the sites below). Applied by
:func:`~rlvr.workers.megatron.parallel.init_megatron_parallel` on CPU only, after
``parallel_state.initialize_model_parallel``; nothing in megatron's files is edited.

Patched (two process-global objects and two functions are replaced by CPU versions):

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

Avoided (rlvr never reaches these sites, so nothing is patched):

4. ``RotaryEmbedding`` moves its ``inv_freq`` to ``torch.cuda.current_device()``: rlvr builds the
   ``GPTModel`` with ``position_embedding_type="none"`` and passes the rotary angles of each row's
   ``position_ids`` itself (also needed to match Hugging Face on left-padded batches).
5. ``FusedScaleMaskSoftmax`` builds its default causal mask on CUDA: rlvr always passes a mask.
6. With pipeline stages and tied embeddings, ``GPTModel`` copies the embedding to the last stage
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
from megatron.core import parallel_state
from megatron.core.tensor_parallel import random as megatron_random
from megatron.core.utils import GlobalMemoryBuffer

__all__ = ["SUPPORTED_VERSIONS", "CpuRNGStatesTracker", "CpuMemoryBuffer", "apply_cpu_shims"]

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


def apply_cpu_shims(model_parallel_seed: int) -> None:
    """Install shims 1, 2 and 3 (after ``initialize_model_parallel``, which creates the buffer).

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


def _no_cuda_rng_state(*args, **kwargs) -> torch.Tensor:
    """Shim 3: the CUDA generator state of a process without CUDA (nothing to save)."""
    return torch.empty(0, dtype=torch.uint8)


def _set_no_cuda_rng_state(new_state: torch.Tensor, *args, **kwargs) -> None:
    """Shim 3: restoring the (empty) CUDA generator state of a process without CUDA."""
    return None
