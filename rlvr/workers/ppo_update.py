"""The PPO update of a trained model (actor or critic), top to bottom.

One call of :func:`run_ppo_epochs` is one ``update_actor`` / ``update_critic``:

1. ``epochs`` passes over the worker's batch, cut into mini-batches of ``mini_batch_size`` rows
   (in a fresh random order each pass when ``shuffle``);
2. per mini-batch, :func:`update_mini_batch`: the gradient of the mini-batch loss is accumulated
   over its micro-batches, each micro-batch loss weighted by :func:`loss_share`;
3. then :func:`optimizer_step`: clip the global gradient norm and step the optimizer, or skip the
   step when the norm is not finite.

:func:`loss_share` makes the accumulated gradient, summed over micro-batches and averaged over
data-parallel ranks (FSDP2's reduce-scatter averages), equal to the gradient of one mini-batch
loss aggregated over all ranks: ``agg_loss`` averages within a micro-batch (over tokens for
``token-mean``, over non-empty sequences for the ``seq-mean-*`` modes), and the share turns those
averages back into the average over the whole global mini-batch.

The loss itself is the caller's ``micro_loss`` (the actor's policy loss, the critic's value loss).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from rlvr.utils import core_lending
from rlvr.workers.collectives import all_reduce_sum
from rlvr.workers.fsdp import clip_grad_norm

__all__ = ["MiniBatchUpdate", "loss_share", "optimizer_step", "run_ppo_epochs", "update_mini_batch"]

MicroLoss = Callable[[dict[str, torch.Tensor]], tuple[torch.Tensor, torch.Tensor]]
ClipGradNorm = Callable[[nn.Module, float], float]


@dataclass
class MiniBatchUpdate:
    """What one mini-batch update did.

    Attributes:
        metric_sums: ``[num_metrics]`` float64 (CPU) sums of the micro-batch metrics, each weighted
            by its loss share and summed over ranks: the global mini-batch means.
        grad_norm: global gradient norm before clipping (``inf``/``nan`` when not finite).
        stepped: whether the optimizer stepped (False when the norm was not finite).
    """

    metric_sums: torch.Tensor
    grad_norm: float
    stepped: bool


def run_ppo_epochs(
    batch: dict[str, torch.Tensor],
    train_mini_batch: Callable[[dict[str, torch.Tensor]], dict[str, float]],
    *,
    epochs: int,
    mini_batch_size: int,
    shuffle: bool,
    generator: torch.Generator | None = None,
) -> dict[str, list[float]]:
    """``epochs`` passes over ``batch`` (tensors ``[rows, ...]``) in mini-batches of
    ``mini_batch_size`` rows, calling ``train_mini_batch`` on each; returns metric name -> one
    value per mini-batch. ``generator`` draws the shuffled orders (None: the global RNG)."""
    rows = next(iter(batch.values())).shape[0]
    metrics: dict[str, list[float]] = defaultdict(list)
    for _ in range(epochs):
        order = torch.randperm(rows, generator=generator) if shuffle else torch.arange(rows)
        for start in range(0, rows, mini_batch_size):
            index = order[start : start + mini_batch_size]
            mini = {key: value[index] for key, value in batch.items()}
            for name, value in train_mini_batch(mini).items():
                metrics[name].append(value)
    return dict(metrics)


def update_mini_batch(
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    mini: dict[str, torch.Tensor],
    micro_batches: list[list[int]],
    micro_loss: MicroLoss,
    num_metrics: int,
    *,
    loss_agg_mode: str,
    grad_clip: float,
    world_size: int,
    device: torch.device,
    sp_size: int = 1,
    clip_grad_norm_fn: ClipGradNorm = clip_grad_norm,
    group: dist.ProcessGroup | None = None,
) -> MiniBatchUpdate:
    """One optimizer step over a mini-batch: gradient accumulation over its micro-batches, then
    :func:`optimizer_step`.

    Args:
        mini: the mini-batch, tensors ``[b, ...]`` with ``response_mask [b, R]`` (on any device).
        micro_batches: row indices of ``mini`` per micro-batch.
        micro_loss: ``micro -> (loss, metrics [num_metrics])``; ``micro`` is on ``device``.
        num_metrics: length of the metric vector ``micro_loss`` returns.
        world_size: data-parallel ranks (over which FSDP2 averages the gradients).
        sp_size: ranks that hold the same rows (a Ulysses sequence-parallel group, whose ranks'
            gradients add up to the gradient of their rows): their rows and metrics count once.
        clip_grad_norm_fn: ``(module, max_norm) -> norm`` that finishes the gradients (averaged over
            the data-parallel ranks) and clips their global norm (FSDP2's by default).
        group: the data-parallel process group (None: the default group).
    """
    mask = mini["response_mask"]
    counts = torch.tensor([float(mask.sum()), float((mask.sum(-1) > 0).sum())], dtype=torch.float64)
    global_tokens, global_seqs = (all_reduce_sum(counts.to(device), world_size, group) / sp_size).tolist()
    sums = torch.zeros(num_metrics, dtype=torch.float64)
    optimizer.zero_grad(set_to_none=True)
    for idx in micro_batches:
        index = torch.tensor(idx)
        micro = {key: value[index].to(device) for key, value in mini.items()}
        share = loss_share(micro["response_mask"], global_tokens, global_seqs, loss_agg_mode, world_size)
        loss, values = micro_loss(micro)
        (loss * share).backward()
        sums += values.double() * (share / world_size)
    grad_norm, stepped = optimizer_step(module, optimizer, grad_clip, clip_grad_norm_fn)
    return MiniBatchUpdate((all_reduce_sum(sums.to(device), world_size, group) / sp_size).cpu(), grad_norm, stepped)


def optimizer_step(module: nn.Module, optimizer: torch.optim.Optimizer, grad_clip: float,
                   clip_grad_norm_fn: ClipGradNorm = clip_grad_norm) -> tuple[float, bool]:
    """Clip the global gradient norm to ``grad_clip`` and step, or skip the step when the norm is
    not finite; the gradients are cleared either way. Returns ``(norm before clipping, stepped)``."""
    core_lending.fit_threads()  # the step runs on the rollout's cores too while it waits
    grad_norm = clip_grad_norm_fn(module, grad_clip)
    finite = bool(torch.isfinite(torch.tensor(grad_norm)))
    if finite:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm, finite


def loss_share(response_mask: torch.Tensor, global_tokens: float, global_seqs: float, loss_agg_mode: str,
               world_size: int) -> float:
    """Weight of a micro-batch's aggregated loss inside the global mini-batch.

    ``agg_loss`` averages over the micro-batch (tokens for ``token-mean``, non-empty sequences for
    the ``seq-mean-*`` modes). Multiplying by ``micro count / global count`` turns the sum over
    micro-batches and ranks into the average over the whole mini-batch; the factor ``world_size``
    undoes FSDP's averaging of gradients over ranks (``token-sum`` needs only that factor).

    Args:
        response_mask: ``[micro_rows, response_len]`` of the micro-batch.
        global_tokens: valid tokens in the mini-batch over all ranks.
        global_seqs: sequences with at least one valid token in the mini-batch over all ranks.
    """
    if loss_agg_mode == "token-sum":
        return float(world_size)
    if loss_agg_mode == "token-mean":
        return float(response_mask.sum()) / max(global_tokens, 1.0) * world_size
    return float((response_mask.sum(-1) > 0).sum()) / max(global_seqs, 1.0) * world_size
