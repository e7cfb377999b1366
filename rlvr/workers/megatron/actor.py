"""The Megatron PPO actor and critic: the FSDP2 actor's and critic's algorithms over a megatron stage.

:class:`MegatronPPOActor` and :class:`MegatronPPOCritic` keep everything of
:class:`~rlvr.workers.actor.dp_actor.DataParallelPPOActor` and
:class:`~rlvr.workers.critic.dp_critic.DataParallelPPOCritic` (micro-batching, the policy and value
losses, the update loop of :mod:`rlvr.workers.ppo_update`) and replace the forward pass and the
gradient finishing:

- the forward runs this rank's pipeline stage; on the last stage the vocabulary-parallel LM head
  gives each tensor-parallel rank the logits of its vocabulary slice, and log-probs and entropy
  come from :func:`~rlvr.workers.megatron.vocab_parallel.vocab_parallel_log_probs` (the full
  ``[b, r, vocab]`` logits are never gathered); the last stage broadcasts them to the other stages
  (:mod:`~rlvr.workers.megatron.pipeline`);
- batch sizes and the loss shares count data-parallel ranks, and the gradients are averaged over
  them and clipped by :func:`~rlvr.workers.megatron.grads.clip_grad_norm`;
- the ranks that share a batch (tensor and pipeline peers) take the same CPU RNG state before an
  update, so a shuffled mini-batch order is the same on all of them;
- a mixture-of-experts policy on one stage routes through its :class:`~rlvr.workers.megatron.moe.MegatronRouterTap`
  (routing replay, the load-balancing loss, the expert-load metrics, as on FSDP2); with expert
  parallelism every micro-batch runs on all its columns, so the expert-parallel ranks, which exchange
  their tokens in every MoE layer, run the same shapes.
"""

from __future__ import annotations

import torch

from rlvr.protocol import DataProto
from rlvr.workers.actor.dp_actor import DataParallelPPOActor, response_window
from rlvr.workers.critic.dp_critic import DataParallelPPOCritic
from rlvr.workers.megatron.grads import clip_grad_norm
from rlvr.workers.megatron.model import MegatronPolicy, MegatronStage, MegatronValueModel
from rlvr.workers.megatron.parallel import broadcast_rng_state
from rlvr.workers.megatron.pipeline import broadcast_from_last_stage
from rlvr.workers.megatron.vocab_parallel import vocab_parallel_log_probs
from rlvr.workers.moe.layout import TokenLayout
from rlvr.workers.moe.routers import RoutingTap

__all__ = ["MegatronPPOActor", "MegatronPPOCritic", "policy_log_probs", "policy_window"]


def _share_with_stages(model: MegatronStage, tensors: list, shapes: list, link: torch.Tensor) -> list[torch.Tensor]:
    """The last stage's float32 ``tensors`` on every stage; earlier stages add their pipeline ``link``."""
    p = model.parallel
    if p.pp == 1:
        return tensors
    shared = broadcast_from_last_stage(tensors, shapes, p.last_stage, p.last_stage_rank, p.pp_group,
                                       model.inv_freq.device)
    return shared if p.last_stage else [t + link for t in shared]


def policy_window(model: MegatronPolicy, batch: dict[str, torch.Tensor]) -> tuple[int, int, int]:
    """``(start, stop, num_response)`` of the columns a forward runs: those that are not padding in every
    row (:func:`~rlvr.workers.actor.dp_actor.response_window`), or all of them with expert parallelism."""
    if model.parallel.ep > 1:
        return 0, batch["input_ids"].shape[1], batch["responses"].shape[1]
    return response_window(batch)


def policy_log_probs(model: MegatronPolicy, batch: dict[str, torch.Tensor], temperature: float,
                     with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of the response tokens (and the entropy) under ``softmax(logits / temperature)``.

    Args:
        batch: ``input_ids``/``attention_mask``/``position_ids`` ``[b, P+R]``, ``responses`` ``[b, R]``.

    Returns:
        ``(log_probs [b, R], entropy [b, R] or None)`` float32, 0 past the last response column
        that is not padding in every row; the same on every rank of the model.
    """
    start, stop, num_response = policy_window(model, batch)
    window = {key: batch[key][:, start:stop] for key in ("input_ids", "attention_mask", "position_ids")}
    hidden, link = model(**window)
    rows, response_len = batch["responses"].shape
    outputs: list[torch.Tensor | None] = [None, None] if with_entropy else [None]
    if hidden is not None:
        logits = model.logits(hidden[-(num_response + 1) : -1]).transpose(0, 1)  # [b, r, vocab / tp]
        labels = batch["responses"][:, :num_response]
        log_probs, entropy = vocab_parallel_log_probs(
            logits, labels, model.vocab_start, model.shape.vocab_size, model.parallel.tp_group, temperature,
            with_entropy)
        outputs = [log_probs, entropy] if with_entropy else [log_probs]
    shared = _share_with_stages(model, outputs, [(rows, num_response)] * len(outputs), link)
    padded = [torch.nn.functional.pad(t, (0, response_len - num_response)) for t in shared]
    return padded[0], padded[1] if with_entropy else None


class MegatronPPOActor(DataParallelPPOActor):
    """The PPO actor on a :class:`~rlvr.workers.megatron.model.MegatronPolicy` (see the module docstring).

    Args:
        config: the ``actor_rollout_ref.actor`` section.
        module: this rank's stage of the policy.
        optimizer: AdamW over the stage's parameters; None for a frozen reference.
        mini_batch_size: sequences per optimizer step on this data-parallel rank.
        log_prob_micro_batch_size: sequences per forward in ``compute_log_prob``.
        router_replay: a mixture-of-experts policy's ``router_replay.mode`` (the reference: disabled).
    """

    def __init__(self, config, module: MegatronPolicy, optimizer: torch.optim.Optimizer | None, *,
                 mini_batch_size: int, log_prob_micro_batch_size: int, router_replay: str = "disabled") -> None:
        p = module.parallel
        self.clip_grad_norm_fn = clip_grad_norm
        self.dp_group = p.dp_group
        super().__init__(config, module, optimizer, mini_batch_size=mini_batch_size,
                         log_prob_micro_batch_size=log_prob_micro_batch_size, world_size=p.dp,
                         device=module.inv_freq.device, router_replay=router_replay)

    def _router_tap(self) -> RoutingTap | None:
        return self.module.router_tap

    def _forward(self, batch: dict[str, torch.Tensor], temperature: float, calculate_entropy: bool,
                 entropy_grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs ``[b, R]`` and optional entropy (with its gradient only when ``entropy_grad``)."""
        if self.routing is not None:
            start, stop, _ = policy_window(self.module, batch)
            self.routing.start(batch, TokenLayout.padded(batch["attention_mask"], start, stop, seq_major=True))
        log_probs, entropy = policy_log_probs(self.module, batch, temperature, calculate_entropy)
        if entropy is not None and not entropy_grad:
            entropy = entropy.detach()
        return log_probs, entropy

    def update_policy(self, data: DataProto) -> dict[str, list[float]]:
        """The PPO update of :class:`DataParallelPPOActor`, after aligning the RNG of the model's ranks."""
        broadcast_rng_state(self.module.parallel)
        return super().update_policy(data)


class MegatronPPOCritic(DataParallelPPOCritic):
    """The PPO critic on a :class:`~rlvr.workers.megatron.model.MegatronValueModel`.

    Args:
        config: the ``critic`` section.
        module: this rank's stage of the value model.
        optimizer: AdamW over the stage's parameters.
        mini_batch_size: sequences per optimizer step on this data-parallel rank.
    """

    def __init__(self, config, module: MegatronValueModel, optimizer: torch.optim.Optimizer, *,
                 mini_batch_size: int) -> None:
        p = module.parallel
        super().__init__(config, module, optimizer, mini_batch_size=mini_batch_size, world_size=p.dp,
                         device=module.inv_freq.device)
        self.clip_grad_norm_fn = clip_grad_norm
        self.dp_group = p.dp_group

    def _forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Values of the response positions ``[b, R]`` (float32), the same on every rank of the model."""
        hidden, link = self.module(batch["input_ids"], batch["attention_mask"], batch["position_ids"])
        rows, response_len = batch["responses"].shape
        values = None
        if hidden is not None:
            values = self.module.values(hidden)[:, -response_len - 1 : -1]
        return _share_with_stages(self.module, [values], [(rows, response_len)], link)[0]
