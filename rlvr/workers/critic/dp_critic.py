"""The data-parallel PPO critic: values of the response positions and the clipped value update.

The value of response token ``t`` is read from the hidden state that *predicts* it (the position
just before it), as in verl: the state is the prompt plus the response up to ``t - 1``. Value
clipping follows PPO (Schulman et al. 2017, arXiv:1707.06347) through
``core_algos.compute_value_loss``; the update loop around it is :mod:`rlvr.workers.ppo_update`.
"""

from __future__ import annotations

import torch

from rlvr.protocol import DataProto
from rlvr.trainer.ppo.core_algos import compute_value_loss
from rlvr.workers.batching import micro_batch_indices, select_batch_keys
from rlvr.workers.fsdp import clip_grad_norm
from rlvr.workers.models import CriticModel
from rlvr.workers.ppo_update import run_ppo_epochs, update_mini_batch

__all__ = ["DataParallelPPOCritic"]

_FORWARD_KEYS = ("input_ids", "attention_mask", "position_ids", "responses")


class DataParallelPPOCritic:
    """Computes and trains the value function.

    Args:
        config: the ``critic`` section.
        module: a :class:`CriticModel` (plain or FSDP2-sharded).
        optimizer: AdamW over the critic's trainable parameters.
        mini_batch_size: sequences per optimizer step on this worker.
        world_size: data-parallel ranks.
        device: where the compute runs.
    """

    clip_grad_norm_fn = staticmethod(clip_grad_norm)
    """``(module, max_norm) -> norm``: finishes and clips the gradients (a training backend's own)."""
    dp_group = None
    """The data-parallel process group (None: the default group, every rank holds its own data)."""

    def __init__(self, config, module: CriticModel, optimizer: torch.optim.Optimizer, *, mini_batch_size: int,
                 world_size: int, device: str | torch.device) -> None:
        self.config = config
        self.module = module
        self.optimizer = optimizer
        self.mini_batch_size = mini_batch_size
        self.world_size = world_size
        self.device = torch.device(device)

    def _forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Values of the response positions ``[b, R]`` (float32)."""
        response_len = batch["responses"].shape[1]
        values = self.module(batch["input_ids"], batch["attention_mask"], batch["position_ids"])
        return values[:, -response_len - 1 : -1]

    def _micro_batches(self, batch: dict[str, torch.Tensor], size: int) -> list[list[int]]:
        return micro_batch_indices(batch["attention_mask"].sum(-1), size, False, 0, self.world_size)

    @torch.no_grad()
    def compute_values(self, data: DataProto) -> torch.Tensor:
        """Values ``[B, R]`` (float32, CPU), zero outside ``response_mask`` when it is present."""
        batch = {key: data.batch[key] for key in _FORWARD_KEYS}
        rows, response_len = batch["responses"].shape
        values = torch.zeros(rows, response_len)
        self.module.eval()
        for idx in self._micro_batches(batch, self.config.ppo_micro_batch_size_per_gpu):
            index = torch.tensor(idx)
            values[index] = self._forward({k: v[index].to(self.device) for k, v in batch.items()}).cpu()
        if "response_mask" in data.batch.keys():
            values = values * data.batch["response_mask"].to(values.dtype)
        return values

    def update_critic(self, data: DataProto) -> dict[str, list[float]]:
        """``ppo_epochs`` passes in mini-batches over ``data`` (needs ``values``, ``returns``,
        ``response_mask``); returns ``critic/vf_loss``, ``critic/vf_clipfrac``,
        ``critic/grad_norm``, ``critic/skipped_steps``, one value per mini-batch."""
        batch = select_batch_keys(data.batch, [*_FORWARD_KEYS, "response_mask", "values", "returns"], "update_critic")
        self.module.train()
        return run_ppo_epochs(
            batch, self._train_mini_batch, epochs=self.config.ppo_epochs, mini_batch_size=self.mini_batch_size,
            shuffle=False,
        )

    def _micro_loss(self, micro: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Value loss of one micro-batch and its metrics ``[vf_loss, vf_clipfrac]`` (float64)."""
        vf_loss, vf_clipfrac = compute_value_loss(
            self._forward(micro), micro["returns"], micro["values"], micro["response_mask"],
            self.config.cliprange_value, self.config.loss_agg_mode,
        )
        return vf_loss, torch.tensor([vf_loss.item(), vf_clipfrac.item()], dtype=torch.float64)

    def _train_mini_batch(self, mini: dict[str, torch.Tensor]) -> dict[str, float]:
        update = update_mini_batch(
            self.module, self.optimizer, mini, self._micro_batches(mini, self.config.ppo_micro_batch_size_per_gpu),
            self._micro_loss, 2, loss_agg_mode=self.config.loss_agg_mode, grad_clip=self.config.grad_clip,
            world_size=self.world_size, device=self.device, clip_grad_norm_fn=self.clip_grad_norm_fn,
            group=self.dp_group,
        )
        return {
            "critic/vf_loss": float(update.metric_sums[0]),
            "critic/vf_clipfrac": float(update.metric_sums[1]),
            "critic/grad_norm": update.grad_norm,
            "critic/skipped_steps": 0.0 if update.stepped else 1.0,
        }
