"""Frozen models: models that score fixed samples and never train (the reference policy, a reward
model, a distillation teacher).

They share one way of being held (:class:`FrozenModel`): FSDP2-sharded over the worker group like
the trained roles, parameters on CPU between calls with ``fsdp_config.param_offload`` (GPU only),
and micro-batched by count or by token budget (:func:`~rlvr.workers.batching.micro_batch_indices`,
the same collective rule as the actor, so every rank runs the same number of forwards). A frozen
*policy* (reference, teacher) reads log-probs with the actor's own code
(:class:`~rlvr.workers.actor.dp_actor.DataParallelPPOActor` without an optimizer, built by
:func:`frozen_policy`); a reward model has its own forward (:mod:`rlvr.workers.reward_model`).

:class:`~rlvr.workers.frozen_worker.FrozenModelWorker` is the worker base of the frozen roles that run as worker groups of
their own (reward model, teacher); the reference also runs inside the hybrid actor worker
(:class:`~rlvr.workers.engine_workers.ActorRolloutRefWorker`, ``role`` with ``ref``), where it is the
same :func:`frozen_policy`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from rlvr.workers.actor.dp_actor import DataParallelPPOActor
from rlvr.workers.batching import micro_batch_indices
from rlvr.workers.fsdp import shard_module
from rlvr.workers.worker_utils import Placement

__all__ = ["FrozenModel", "frozen_policy"]


class FrozenModel:
    """A frozen module: sharded, placed between calls, micro-batched.

    Args:
        module: the model, on ``device``, identical on every rank (it is sharded here); its
            parameters are frozen and it is put in eval mode.
        world_size: ranks of the worker group.
        device: the worker's device.
        param_offload: keep the parameters on CPU between calls (GPU only).
        reshard_after_forward: FSDP2's ``reshard_after_forward``.
        micro_batch_size: rows per forward when not ``use_dynamic_bsz``.
        use_dynamic_bsz: size the micro-batches by token budget.
        max_token_len: that token budget (rows x longest row).
        shard: False for a module that a backend of its own has placed over the ranks (Megatron).
        shard_options: more :func:`~rlvr.workers.fsdp.shard_module` options (the reference's
            ``fsdp_config``: CPU offload policy, forward prefetch, mixed precision).
    """

    def __init__(self, module: nn.Module, *, world_size: int, device: str, param_offload: bool,
                 reshard_after_forward: bool = True, micro_batch_size: int = 1, use_dynamic_bsz: bool = False,
                 max_token_len: int = 16384, shard: bool = True, shard_options: dict | None = None) -> None:
        device_type = "cuda" if device.startswith("cuda") else "cpu"
        if shard:
            module = shard_module(module, world_size, device_type, reshard_after_forward, **(shard_options or {}))
        self.module = module.requires_grad_(False).eval()
        self.world_size, self.device, self.param_offload = world_size, torch.device(device), param_offload
        self.micro_batch_size, self.use_dynamic_bsz, self.max_token_len = micro_batch_size, use_dynamic_bsz, max_token_len
        self.placement = Placement(self.module, None, device)
        self.rest()

    def rest(self) -> None:
        """Placement between calls (CPU with ``param_offload``; GPU only)."""
        self.placement.place(params=not self.param_offload, optimizer=False)

    @contextmanager
    def on_device(self) -> Iterator[nn.Module]:
        """The module with its parameters on the device for the block, at rest after it."""
        self.placement.place(params=True, optimizer=False)
        try:
            yield self.module
        finally:
            self.rest()

    def micro_batches(self, seq_lens: torch.Tensor) -> list[list[int]]:
        """Row indices of each micro-batch of a local batch (``seq_lens [rows]`` real tokens per row);
        collective with ``use_dynamic_bsz`` (every rank must call)."""
        return micro_batch_indices(seq_lens, self.micro_batch_size, self.use_dynamic_bsz, self.max_token_len,
                                   self.world_size)


def frozen_policy(module: nn.Module, actor_config, *, world_size: int, device: str, fsdp_config,
                  micro_batch_size: int, use_dynamic_bsz: bool, max_token_len: int, use_remove_padding: bool,
                  sp_size: int, shared: bool = False, shard_options: dict | None = None,
                  compute_dtype: torch.dtype | None = None, compile_forward: bool = False
                  ) -> tuple[FrozenModel | None, DataParallelPPOActor]:
    """A frozen causal LM that reads log-probs of responses: the reference policy or a teacher.

    Args:
        module: the causal LM (frozen), or with ``shared`` the actor's own (LoRA) module.
        actor_config: the actor section (the log-prob path's settings, e.g. prompt sharing; nothing
            is trained).
        fsdp_config: ``param_offload`` and ``reshard_after_forward`` of the frozen model.
        micro_batch_size, use_dynamic_bsz, max_token_len: its log-prob micro-batches.
        use_remove_padding, sp_size: packed forwards and Ulysses ranks (see ``DataParallelPPOActor``).
        shared: the module is the actor's (a LoRA actor's reference: adapters disabled at the call);
            it is neither sharded again nor frozen nor placed here.
        shard_options: more FSDP2 options (see :class:`FrozenModel`).
        compute_dtype, compile_forward: mixed precision on one rank and ``torch.compile`` of the
            log-prob forward (see ``DataParallelPPOActor``).

    Returns:
        ``(frozen model or None when shared, log-prob reader)``; read inside ``frozen.on_device()``.
    """
    frozen = None
    if not shared:
        frozen = FrozenModel(module, world_size=world_size, device=device, param_offload=fsdp_config.param_offload,
                             reshard_after_forward=fsdp_config.reshard_after_forward,
                             micro_batch_size=micro_batch_size, use_dynamic_bsz=use_dynamic_bsz,
                             max_token_len=max_token_len, shard_options=shard_options)
        module = frozen.module
    reader = DataParallelPPOActor(
        actor_config, module, None, mini_batch_size=1, log_prob_micro_batch_size=micro_batch_size,
        world_size=world_size, device=device, log_prob_use_dynamic_bsz=use_dynamic_bsz,
        log_prob_max_token_len=max_token_len, use_remove_padding=use_remove_padding, sp_size=sp_size,
        compute_dtype=compute_dtype, compile_forward=compile_forward)
    return frozen, reader
