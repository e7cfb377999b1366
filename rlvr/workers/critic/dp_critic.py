"""The data-parallel PPO critic: values of the response positions and the clipped value update.

The value of response token ``t`` is read from the hidden state that *predicts* it (the position
just before it), as in verl: the state is the prompt plus the response up to ``t - 1``. Value
clipping follows PPO (Schulman et al. 2017, arXiv:1707.06347) through
``core_algos.compute_value_loss``; the update loop around it is :mod:`rlvr.workers.ppo_update`.
Packing (``critic.model.use_remove_padding``), token budgets (``critic.use_dynamic_bsz``) and Ulysses
sequence parallelism (``critic.ulysses_sequence_parallel_size``) work as in the actor
(:mod:`rlvr.workers.actor.dp_actor`). Rows with images (``multi_modal_inputs``) reach a
vision-language backbone with their images (unpacked).
"""

from __future__ import annotations

import torch

from rlvr.protocol import DataProto
from rlvr.trainer.ppo.core_algos import compute_value_loss
from rlvr.workers.optimizer import max_grad_norm
from rlvr.workers.batching import micro_batch_indices, select_batch_keys
from rlvr.utils.multimodal import MULTI_MODAL_INPUTS, model_inputs, multi_modal_batch
from rlvr.workers.critic.packed_values import packed_values
from rlvr.workers.fsdp import clip_grad_norm
from rlvr.workers.models import CriticModel, unwrap_hf_model
from rlvr.workers.ppo_update import run_ppo_epochs, update_mini_batch
from rlvr.workers.ulysses import gather_rows, own_rows, sequence_parallel_group, shared_generator

__all__ = ["DataParallelPPOCritic"]

_FORWARD_KEYS = ("input_ids", "attention_mask", "position_ids", "responses")


class DataParallelPPOCritic:
    """Computes and trains the value function.

    Args:
        config: the ``critic`` section.
        module: a :class:`CriticModel` (plain or FSDP2-sharded).
        optimizer: AdamW over the critic's trainable parameters.
        mini_batch_size: sequences per optimizer step on this worker.
        world_size: ranks of the worker group.
        device: where the compute runs.
        use_remove_padding: run every forward on packed micro-batches.
        sp_size: Ulysses sequence-parallel ranks per group (needs ``use_remove_padding``).
        compute_dtype: mixed precision on one rank (``critic.fsdp_config.dtype``): forward passes run
            under ``torch.autocast`` in this dtype (several ranks: FSDP2's policy).

    ``compute_values`` runs micro-batches of ``forward_micro_batch_size_per_gpu``; the update shuffles
    its mini-batches with ``shuffle`` (seeded by ``data_loader_seed`` when set) and aggregates with
    ``loss_scale_factor``.
    """

    clip_grad_norm_fn = staticmethod(clip_grad_norm)
    """``(module, max_norm) -> norm``: finishes and clips the gradients (a training backend's own)."""
    dp_group = None
    """The data-parallel process group (None: the default group, every rank holds its own data)."""

    def __init__(self, config, module: CriticModel, optimizer: torch.optim.Optimizer, *, mini_batch_size: int,
                 world_size: int, device: str | torch.device, use_remove_padding: bool = False,
                 sp_size: int = 1, compute_dtype: torch.dtype | None = None) -> None:
        self.config = config
        self.module = module
        self.optimizer = optimizer
        self.mini_batch_size = mini_batch_size
        self.world_size = world_size
        self.device = torch.device(device)
        self.use_remove_padding = use_remove_padding
        if sp_size > 1 and not use_remove_padding:
            raise ValueError("Ulysses sequence parallelism runs on packed sequences: it needs use_remove_padding")
        self.sp = sequence_parallel_group(sp_size, world_size)
        self.autocast_dtype = compute_dtype if world_size == 1 else None
        seed = config.data_loader_seed
        self.shuffle_generator = torch.Generator().manual_seed(int(seed)) if seed is not None else None

    def _forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Values of the response positions ``[b, R]`` (float32)."""
        if self.autocast_dtype is None:
            return self._values(batch)
        with torch.autocast(self.device.type, dtype=self.autocast_dtype):
            return self._values(batch).float()

    def _values(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.use_remove_padding:
            return packed_values(self.module, batch, self.sp)
        response_len = batch["responses"].shape[1]
        inputs = model_inputs(unwrap_hf_model(self.module.backbone), batch["input_ids"], batch["attention_mask"],
                              batch["position_ids"], batch.get(MULTI_MODAL_INPUTS))
        values = self.module(**inputs)
        return values[:, -response_len - 1 : -1]

    def _micro_batches(self, batch: dict[str, torch.Tensor], size: int, max_token_len: int) -> list[list[int]]:
        return micro_batch_indices(
            batch["attention_mask"].sum(-1), size, self.config.use_dynamic_bsz,
            max_token_len * self.sp.size, self.world_size, packed=self.use_remove_padding,
        )

    @torch.no_grad()
    def compute_values(self, data: DataProto) -> torch.Tensor:
        """Values ``[B, R]`` (float32, CPU), zero outside ``response_mask`` when it is present."""
        batch = multi_modal_batch(gather_rows({key: data.batch[key] for key in _FORWARD_KEYS}, self.sp),
                                  data.non_tensor_batch, self.module, self.world_size,
                                  "compute_values", packed=self.use_remove_padding)
        rows, response_len = batch["responses"].shape
        values = torch.zeros(rows, response_len)
        self.module.eval()
        for idx in self._micro_batches(batch, self.config.forward_micro_batch_size_per_gpu,
                                       self.config.forward_max_token_len_per_gpu):
            index = torch.tensor(idx)
            values[index] = self._forward({k: v[index].to(self.device) for k, v in batch.items()}).cpu()
        values = own_rows(values, self.sp)
        if "response_mask" in data.batch.keys():
            values = values * data.batch["response_mask"].to(values.dtype)
        return values

    def update_critic(self, data: DataProto) -> dict[str, list[float]]:
        """``ppo_epochs`` passes in mini-batches over ``data`` (needs ``values``, ``returns``,
        ``response_mask``); returns ``critic/vf_loss``, ``critic/vf_clipfrac``,
        ``critic/grad_norm``, ``critic/skipped_steps``, one value per mini-batch."""
        keys = [*_FORWARD_KEYS, "response_mask", "values", "returns"]
        batch = multi_modal_batch(
            gather_rows(select_batch_keys(data.batch, keys, "update_critic"), self.sp, block=self.mini_batch_size),
            data.non_tensor_batch, self.module, self.world_size, "update_critic",
            packed=self.use_remove_padding)
        self.module.train()
        shuffle = bool(self.config.shuffle)
        generator = self.shuffle_generator or (shared_generator(self.sp) if shuffle else None)
        return run_ppo_epochs(
            batch, self._train_mini_batch, epochs=self.config.ppo_epochs,
            mini_batch_size=self.mini_batch_size * self.sp.size, shuffle=shuffle, generator=generator,
        )

    def _micro_loss(self, micro: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Value loss of one micro-batch and its metrics ``[vf_loss, vf_clipfrac]`` (float64)."""
        vf_loss, vf_clipfrac = compute_value_loss(
            self._forward(micro), micro["returns"], micro["values"], micro["response_mask"],
            self.config.cliprange_value, self.config.loss_agg_mode, loss_scale_factor=self.config.loss_scale_factor,
        )
        return vf_loss, torch.tensor([vf_loss.item(), vf_clipfrac.item()], dtype=torch.float64)

    def _train_mini_batch(self, mini: dict[str, torch.Tensor]) -> dict[str, float]:
        update = update_mini_batch(
            self.module, self.optimizer, mini,
            self._micro_batches(mini, self.config.ppo_micro_batch_size_per_gpu, self.config.ppo_max_token_len_per_gpu),
            self._micro_loss, 2, loss_agg_mode=self.config.loss_agg_mode, grad_clip=max_grad_norm(self.config),
            world_size=self.world_size, device=self.device, sp_size=self.sp.size,
            clip_grad_norm_fn=self.clip_grad_norm_fn, group=self.dp_group,
        )
        return {
            "critic/vf_loss": float(update.metric_sums[0]),
            "critic/vf_clipfrac": float(update.metric_sums[1]),
            "critic/grad_norm": update.grad_norm,
            "critic/skipped_steps": 0.0 if update.stepped else 1.0,
        }
