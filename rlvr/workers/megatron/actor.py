"""The Megatron PPO actor and critic: the FSDP2 actor's and critic's algorithms over a megatron stage.

:class:`MegatronPPOActor` and :class:`MegatronPPOCritic` keep everything of
:class:`~rlvr.workers.actor.dp_actor.DataParallelPPOActor` and
:class:`~rlvr.workers.critic.dp_critic.DataParallelPPOCritic` (micro-batching, the policy and value
losses, the update loop of :mod:`rlvr.workers.ppo_update`) and replace the forward pass and the
gradient finishing:

- the forward runs this rank's pipeline stage; on the last stage the vocabulary-parallel LM head
  gives each tensor-parallel rank the logits of its vocabulary slice, and log-probs and entropy
  come from :func:`~rlvr.workers.megatron.vocab_parallel.vocab_parallel_token_stats` (the full
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
import torch.nn.functional as F

from rlvr.protocol import DataProto
from rlvr.workers.actor.dp_actor import DataParallelPPOActor, response_window
from rlvr.workers.critic.dp_critic import DataParallelPPOCritic
from rlvr.workers.megatron.context_parallel import gather_positions
from rlvr.workers.megatron.grads import clip_grad_norm
from rlvr.workers.megatron.model import MegatronPolicy, MegatronStage, MegatronValueModel
from rlvr.workers.megatron.parallel import broadcast_rng_state
from rlvr.workers.megatron.pipeline import broadcast_from_last_stage
from rlvr.workers.megatron.vocab_parallel import vocab_parallel_token_stats
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
                     with_entropy: bool, with_sum_pi_squared: bool = False) -> dict[str, torch.Tensor]:
    """Log-probs of the response tokens (and the entropy, and ``sum_v p_v^2``) under
    ``softmax(logits / temperature)``.

    Args:
        batch: ``input_ids``/``attention_mask``/``position_ids`` ``[b, P+R]``, ``responses`` ``[b, R]``.

    Returns:
        ``{"log_probs": [b, R]}`` plus ``"entropy"`` / ``"sum_pi_squared"`` when asked, float32, 0
        past the last response column that is not padding in every row; the same on every rank of
        the model.
    """
    start, stop, num_response = policy_window(model, batch)
    window = {key: batch[key][:, start:stop] for key in ("input_ids", "attention_mask", "position_ids")}
    hidden, link = model(**window)
    rows, response_len = batch["responses"].shape
    names = ["log_probs", *(["entropy"] if with_entropy else []), *(["sum_pi_squared"] if with_sum_pi_squared else [])]
    outputs: list[torch.Tensor | None] = [None] * len(names)
    if hidden is not None:
        cp, length = model.parallel.context, window["input_ids"].shape[1]
        if cp.size > 1:  # every local position, labelled with its next token, then gathered in sequence order
            labels = F.pad(window["input_ids"][:, 1:], (0, cp.padded_length(length) - length + 1))
            labels = labels[:, cp.positions(labels.shape[1]).to(labels.device)]
        else:  # the positions that predict the responses
            hidden, labels = hidden[-(num_response + 1) : -1], batch["responses"][:, :num_response]
        logits = model.logits(hidden).transpose(0, 1)  # [b, positions, vocab / tp]
        stats = vocab_parallel_token_stats(logits, labels, model.vocab_start, model.shape.vocab_size,
                                           model.parallel.tp_group, temperature, with_entropy, with_sum_pi_squared)
        outputs = [stats[name] for name in names]
        if cp.size > 1:
            outputs = [gather_positions(t, 1, cp)[:, length - num_response - 1 : length - 1] for t in outputs]
    shared = _share_with_stages(model, outputs, [(rows, num_response)] * len(outputs), link)
    return {name: torch.nn.functional.pad(t, (0, response_len - num_response)) for name, t in zip(names, shared)}


class MegatronPPOActor(DataParallelPPOActor):
    """The PPO actor on a :class:`~rlvr.workers.megatron.model.MegatronPolicy` (see the module docstring).

    Args:
        config: the ``actor_rollout_ref.actor`` section.
        module: this rank's stage of the policy.
        optimizer: AdamW over the stage's parameters; None for a frozen reference.
        mini_batch_size: sequences per optimizer step on this data-parallel rank.
        log_prob_micro_batch_size: sequences per forward in ``compute_log_prob``.
        compute_dtype: ``megatron.dtype`` (mixed precision by autocast).
        router_replay: a mixture-of-experts policy's ``router_replay.mode`` (the reference: disabled).
    """

    def __init__(self, config, module: MegatronPolicy, optimizer: torch.optim.Optimizer | None, *,
                 mini_batch_size: int, log_prob_micro_batch_size: int, compute_dtype: torch.dtype | None = None,
                 router_replay: str = "disabled") -> None:
        p = module.parallel
        self.clip_grad_norm_fn = clip_grad_norm
        self.dp_group = p.dp_group  # before the base class builds the MoE routing, which sums over it
        super().__init__(config, module, optimizer, mini_batch_size=mini_batch_size,
                         log_prob_micro_batch_size=log_prob_micro_batch_size, world_size=p.dp,
                         device=module.inv_freq.device, router_replay=router_replay)
        self.autocast_dtype = compute_dtype  # megatron.dtype: mixed precision by autocast on every layout

    def _router_tap(self) -> RoutingTap | None:
        return self.module.router_tap

    def _forward_stats(self, batch: dict[str, torch.Tensor], temperature: float, calculate_entropy: bool,
                       entropy_grad: bool, calculate_sum_pi_squared: bool = False) -> dict[str, torch.Tensor]:
        """Log-probs ``[b, R]`` and, when asked, the entropy (with its gradient only when
        ``entropy_grad``) and ``sum_pi_squared``; under autocast in ``compute_dtype`` when set; an
        MoE policy's routers armed first (they see the window's tokens sequence-major)."""
        if self.routing is not None:
            start, stop, _ = policy_window(self.module, batch)
            self.routing.start(batch, TokenLayout.padded(batch["attention_mask"], start, stop, seq_major=True))
        with torch.autocast(self.device.type, dtype=self.autocast_dtype or torch.float32,
                            enabled=self.autocast_dtype is not None):
            stats = policy_log_probs(self.module, batch, temperature, calculate_entropy, calculate_sum_pi_squared)
        stats = {name: values.float() for name, values in stats.items()}
        if "entropy" in stats and not entropy_grad:
            stats["entropy"] = stats["entropy"].detach()
        return stats

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
                 mini_batch_size: int, compute_dtype: torch.dtype | None = None) -> None:
        p = module.parallel
        super().__init__(config, module, optimizer, mini_batch_size=mini_batch_size, world_size=p.dp,
                         device=module.inv_freq.device)
        self.autocast_dtype = compute_dtype  # megatron.dtype
        self.clip_grad_norm_fn = clip_grad_norm
        self.dp_group = p.dp_group

    def _forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Values of the response positions ``[b, R]`` (float32), the same on every rank of the model."""
        with torch.autocast(self.device.type, dtype=self.autocast_dtype or torch.float32,
                            enabled=self.autocast_dtype is not None):
            return self._stage_values(batch)

    def _stage_values(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        hidden, link = self.module(batch["input_ids"], batch["attention_mask"], batch["position_ids"])
        rows, response_len = batch["responses"].shape
        length = batch["input_ids"].shape[1]
        values = None
        if hidden is not None:  # with context parallelism: all positions of the padded rows, gathered
            values = gather_positions(self.module.values(hidden), 1, self.module.parallel.context)[:, :length]
            values = values[:, -response_len - 1 : -1]
        return _share_with_stages(self.module, [values], [(rows, response_len)], link)[0]
