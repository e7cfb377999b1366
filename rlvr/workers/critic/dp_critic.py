"""The data-parallel PPO critic: values of the response positions and the clipped value update.

The value of response token ``t`` is read from the hidden state that *predicts* it (the position
just before it), as in verl: the state is the prompt plus the response up to ``t - 1``. Value
clipping follows PPO (Schulman et al. 2017, arXiv:1707.06347) through
``core_algos.compute_value_loss``.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from rlvr.protocol import DataProto
from rlvr.trainer.ppo.core_algos import compute_value_loss
from rlvr.workers.batching import all_reduce_sum, loss_share, micro_batch_indices
from rlvr.workers.fsdp import clip_grad_norm
from rlvr.workers.models import CriticModel

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
        keys = [*_FORWARD_KEYS, "response_mask", "values", "returns"]
        missing = [key for key in keys if key not in data.batch.keys()]
        if missing:
            raise KeyError(f"update_critic needs the batch keys {missing}; got {sorted(data.batch.keys())}")
        batch = {key: data.batch[key] for key in keys}
        rows = batch["responses"].shape[0]
        metrics: dict[str, list[float]] = defaultdict(list)
        self.module.train()
        for _ in range(self.config.ppo_epochs):
            for start in range(0, rows, self.mini_batch_size):
                mini = {key: value[start : start + self.mini_batch_size] for key, value in batch.items()}
                for name, value in self._train_mini_batch(mini).items():
                    metrics[name].append(value)
        return dict(metrics)

    def _train_mini_batch(self, mini: dict[str, torch.Tensor]) -> dict[str, float]:
        mask = mini["response_mask"]
        counts = torch.tensor([float(mask.sum()), float((mask.sum(-1) > 0).sum())], dtype=torch.float64)
        global_tokens, global_seqs = all_reduce_sum(counts.to(self.device), self.world_size).tolist()
        sums = torch.zeros(2, dtype=torch.float64)
        self.optimizer.zero_grad(set_to_none=True)
        for idx in self._micro_batches(mini, self.config.ppo_micro_batch_size_per_gpu):
            index = torch.tensor(idx)
            micro = {key: value[index].to(self.device) for key, value in mini.items()}
            share = loss_share(micro["response_mask"], global_tokens, global_seqs, self.config.loss_agg_mode,
                               self.world_size)
            vpreds = self._forward(micro)
            vf_loss, vf_clipfrac = compute_value_loss(
                vpreds, micro["returns"], micro["values"], micro["response_mask"],
                self.config.cliprange_value, self.config.loss_agg_mode,
            )
            (vf_loss * share).backward()
            vf_loss = vf_loss.detach()
            sums += torch.tensor([vf_loss.item(), vf_clipfrac.item()], dtype=torch.float64) * (share / self.world_size)
        grad_norm = clip_grad_norm(self.module, self.config.grad_clip)
        finite = bool(torch.isfinite(torch.tensor(grad_norm)))
        if finite:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        sums = all_reduce_sum(sums.to(self.device), self.world_size).cpu()
        return {
            "critic/vf_loss": float(sums[0]),
            "critic/vf_clipfrac": float(sums[1]),
            "critic/grad_norm": grad_norm,
            "critic/skipped_steps": 0.0 if finite else 1.0,
        }
