"""Small helpers shared by the role workers: CPU threads, per-rank batch sizes, stage timing and
the placement (device or CPU) of a module and its optimizer state between phases."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING

import torch
from torch import nn

from rlvr.utils.errors import ConfigError

if TYPE_CHECKING:
    from rlvr.trainer.config.schema import RefFSDPConfig
from rlvr.workers.collectives import all_reduce_max
from rlvr.workers.fsdp import move_module, move_optimizer_state

__all__ = ["cpu_workers", "cpu_thread_share", "set_cpu_threads", "per_rank_batch_size", "StageTimer", "Placement",
           "peak_memory_metrics", "seed_role", "use_full_determinism", "rollout_dtype"]


def cpu_workers(config) -> int:
    """Model-worker processes that share the cores (a machine's, on one node): the trainer's (one on
    the local backend) plus, with a rollout apart from the actor (``hybrid_engine=false``), the
    rollout's, which compute at the same time."""
    t = config.trainer
    local = t.backend == "local"
    trainer = 1 if local else t.nnodes * t.n_gpus_per_node
    if config.actor_rollout_ref.hybrid_engine:
        return trainer
    return trainer + (1 if local else config.rollout.nnodes * config.rollout.n_gpus_per_node)


def cpu_thread_share(num_threads: int | None, world_size: int) -> int:
    """A worker's intra-op threads: ``num_threads``, else this process's cores // ``world_size`` (at least 1)."""
    return int(num_threads) if num_threads else max(1, len(os.sched_getaffinity(0)) // world_size)


def set_cpu_threads(num_threads: int | None, world_size: int) -> int:
    """``torch.set_num_threads`` to :func:`cpu_thread_share`; returns it."""
    threads = cpu_thread_share(num_threads, world_size)
    torch.set_num_threads(threads)
    return threads


def per_rank_batch_size(prompts: int, samples_per_prompt: int, world_size: int, key: str) -> int:
    """Sequences per worker for a batch size counted in prompts (``prompts x n / world_size``).

    Raises:
        ConfigError: the sequences do not split evenly over the workers.
    """
    sequences = prompts * samples_per_prompt
    if prompts <= 0 or sequences % world_size:
        raise ConfigError(
            key,
            f"{prompts} prompts x {samples_per_prompt} samples = {sequences} sequences cannot be split evenly "
            f"over {world_size} workers; choose a positive number of prompts whose product with the samples "
            f"per prompt is a multiple of {world_size}",
        )
    return sequences // world_size


class StageTimer:
    """Wall time of the stages of one worker call; values are the slowest rank's (so that every
    rank reports the same numbers and the collected ``meta_info["timing"]`` agrees).

    Args:
        around: a context manager factory entered inside each timed stage with its name (the
            worker's profiler, :meth:`rlvr.utils.profiler.worker.WorkerProfiler.stage`).
    """

    def __init__(self, world_size: int, device: str,
                 around: Callable[[str], AbstractContextManager[None]] | None = None) -> None:
        self.world_size = world_size
        self.device = device
        self.around = around
        self.timing: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            with self.around(name) if self.around is not None else nullcontext():
                yield
        finally:
            self.timing[name] = self.timing.get(name, 0.0) + time.perf_counter() - start

    def result(self) -> dict[str, float]:
        """Stage -> seconds, maximum over the ranks (collective)."""
        names = sorted(self.timing)
        values = torch.tensor([self.timing[n] for n in names], dtype=torch.float64, device=self.device)
        values = all_reduce_max(values, self.world_size).cpu()
        return {name: float(v) for name, v in zip(names, values)}


class Placement:
    """Where a module's parameters and its optimizer state live on a GPU worker.

    On CPU workers every move is a no-op. The hybrid worker moves the actor's parameters and
    optimizer state to CPU for generation and back for training (``fsdp_config.param_offload`` /
    ``optimizer_offload`` keep them on CPU between phases too).
    """

    def __init__(self, module: nn.Module, optimizer: torch.optim.Optimizer | None, device: str) -> None:
        self.module = module
        self.optimizer = optimizer
        self.device = device
        self.params_on_device = True
        self.optimizer_on_device = True

    def place(self, params: bool, optimizer: bool) -> None:
        """Put the parameters / optimizer state on the device (True) or on CPU (False)."""
        if not self.device.startswith("cuda"):
            return
        if params != self.params_on_device:
            move_module(self.module, self.device if params else "cpu")
            self.params_on_device = params
        if self.optimizer is not None and optimizer != self.optimizer_on_device:
            move_optimizer_state(self.optimizer, self.device if optimizer else "cpu")
            self.optimizer_on_device = optimizer
        torch.cuda.empty_cache()


def peak_memory_metrics(device: str, stage: str) -> dict[str, float]:
    """``perf/<stage>/max_memory_allocated_gb`` since the last reset (GPU only; then reset)."""
    if not device.startswith("cuda"):
        return {}
    peak = torch.cuda.max_memory_allocated(device) / 1024**3
    torch.cuda.reset_peak_memory_stats(device)
    return {f"perf/{stage}/max_memory_allocated_gb": peak}


def seed_role(fsdp_config: RefFSDPConfig) -> None:
    """Seed the global RNGs with a role's ``fsdp_config.seed`` (verl's key) before its model is built,
    so that its random parts (LoRA adapters, the value head) come from that seed; None keeps the
    worker's seed (``trainer.seed``)."""
    if fsdp_config.seed is not None:
        from rlvr.utils.seed import set_seed

        set_seed(int(fsdp_config.seed))


def use_full_determinism() -> None:
    """Deterministic torch kernels in this process (verl's ``full_determinism``): the same inputs give
    bit-identical results on the same hardware; an op without a deterministic kernel raises."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)


def rollout_dtype(rollout_config, module: nn.Module) -> torch.dtype | None:
    """The dtype ``rollout.dtype`` asks the HF engine to generate in when it differs from the
    actor's parameters (None: the engine may share the actor's module)."""
    from rlvr.workers.models import torch_dtype

    if rollout_config.dtype is None:
        return None
    dtype = torch_dtype(rollout_config.dtype)
    return None if dtype == next(module.parameters()).dtype else dtype
