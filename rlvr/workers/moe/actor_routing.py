"""The mixture-of-experts side of the actor: routing replay, the load-balancing loss and the load metrics.

An actor whose policy is a transformers MoE model (:func:`~rlvr.workers.moe.routers.router_tap`)
arms the model's :class:`~rlvr.workers.moe.routers.RouterTap` around every forward pass:

- **Routing replay** (``router_replay.mode``, verl's modes): ``R3`` (rollout routing replay; Ma et al.
  2025, "Stabilizing MoE Reinforcement Learning by Aligning Training and Inference Routers",
  arXiv:2510.11370) sends every token to the experts the rollout engine chose for it
  (``routed_experts``, written with ``rollout.enable_rollout_routing_replay``), in ``compute_log_prob``
  and in the update; ``R2`` (routing replay; Zheng et al. 2025, "Group Sequence Policy
  Optimization", arXiv:2507.18071) records the experts of the actor's own ``compute_log_prob`` and
  replays them in the update, so the ratio ``pi_theta / pi_old`` compares the same experts. The
  reference never replays.
- **Load-balancing loss**: the Switch-Transformer loss of each micro-batch
  (:func:`~rlvr.workers.moe.balance.load_balancing_loss`) joins the policy loss with the model
  config's coefficient, ``router_aux_loss_coef``, when the config asks for it
  (``output_router_logits``, transformers' own switch: :attr:`RouterTap.aux_loss_coef`; set both with
  verl's ``actor_rollout_ref.model.override_config``). It is reported as ``actor/moe_aux_loss`` either way.
- **Expert load**: ``actor/moe_load_entropy/layer_<i>``, the entropy (nats) of the share of the
  mini-batch's top-k choices each expert of MoE layer ``i`` got (``log E`` = perfectly balanced),
  over all real tokens of the global mini-batch.
- **Shared prompts** (``actor.share_prompt_forward``, where the actor runs each distinct prompt of a
  micro-batch once: :mod:`rlvr.workers.actor.shared_prompt`): the forward runs in two segments
  (:class:`~rlvr.workers.moe.layout.SharedPromptLayout`). A prompt token counts in the loss and the
  load once per row of its prompt, as in the plain forward; recorded routes come out per row; replay
  sends the prompt's tokens to the experts recorded in one of its rows, and a micro-batch whose rows
  of one prompt carry different prompt routes runs the plain forward instead
  (``actor/moe_shared_prompt_fallback`` counts those micro-batches).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlvr.workers.collectives import all_reduce_sum
from rlvr.workers.moe import REPLAY_MODES
from rlvr.workers.moe.balance import expert_counts, load_balancing_loss, load_entropy
from rlvr.workers.moe.layout import ROUTED_EXPERTS, SharedPromptLayout, TokenLayout
from rlvr.workers.moe.routers import RoutingTap
from rlvr.workers.ulysses import SequenceParallel

__all__ = ["ActorRouting", "ForwardRouting"]

@dataclass(frozen=True)
class ForwardRouting:
    """What the forward passes of one actor call do with the routers.

    Attributes:
        replay: send the tokens to the batch's ``routed_experts``.
        record: keep each micro-batch's routes (``compute_log_prob`` under R2).
        train: keep the router logits for the load-balancing loss and count the expert load.
    """

    replay: bool = False
    record: bool = False
    train: bool = False


class ActorRouting:
    """The routing of one actor's forward passes (module docstring).

    Args:
        tap: the policy model's router tap (an HF model's or a Megatron stage's).
        mode: ``router_replay.mode`` (:data:`REPLAY_MODES`); the reference uses ``"disabled"``.
        aux_coef: coefficient of the load-balancing loss in the policy loss (0: a metric only).
        sp: the actor's sequence-parallel group (its ranks split each packed row).
        world_size: data-parallel ranks (the expert load is summed over them).
        group: the data-parallel process group (None: the default group).
    """

    def __init__(self, tap: RoutingTap, mode: str, aux_coef: float, sp: SequenceParallel, world_size: int,
                 group=None) -> None:
        if mode not in REPLAY_MODES:
            raise ValueError(f"router_replay.mode must be one of {REPLAY_MODES}, got {mode!r}")
        self.tap = tap
        self.mode = mode
        self.aux_coef = aux_coef
        self.sp = sp
        self.world_size = world_size
        self.group = group
        self.layout: TokenLayout | SharedPromptLayout | None = None
        self.step = ForwardRouting()
        self._counts = torch.zeros(tap.shape.layers, tap.shape.num_experts, dtype=torch.float64)
        self._fallbacks = 0

    def log_prob_step(self) -> ForwardRouting:
        """``compute_log_prob``: replay the rollout's routes (R3) or record the actor's own (R2)."""
        return ForwardRouting(replay=self.mode == "R3", record=self.mode == "R2")

    def update_step(self) -> ForwardRouting:
        """The update: replay under R2 and R3; keep logits and count the load."""
        return ForwardRouting(replay=self.mode != "disabled", train=True)

    def require_routes(self, step: ForwardRouting, keys, method: str) -> None:
        """Raise a clear error when ``step`` replays but the batch (its ``keys``) has no routes."""
        if not step.replay or ROUTED_EXPERTS in keys:
            return
        why = ("set actor_rollout_ref.rollout.enable_rollout_routing_replay=true, with an engine and agent loop "
               "that record routes (hf, single_turn)" if self.mode == "R3" else
               "R2 records them in compute_log_prob, which did not run before this update (bypass mode, or "
               "proximal log-probs taken from the update)")
        raise ValueError(f"{method}: router_replay.mode={self.mode} replays the batch's {ROUTED_EXPERTS}, but the "
                         f"batch has none; {why}")

    def start(self, batch: dict[str, torch.Tensor], layout: TokenLayout | SharedPromptLayout) -> None:
        """Arm the tap for the forward pass of micro-batch ``batch`` laid out as ``layout``."""
        replay = layout.tokens(batch[ROUTED_EXPERTS]) if self.step.replay else None
        self.layout = layout
        self.tap.arm(replay, keep_logits=self.step.train, segments=layout.segments)

    def can_share(self, batch: dict[str, torch.Tensor], layout: SharedPromptLayout) -> bool:
        """Whether micro-batch ``batch`` may run on shared prompts (``layout``): always, unless it
        replays routes and the rows of one prompt carry different prompt routes (counted, for
        ``actor/moe_shared_prompt_fallback``; the caller then runs the plain forward)."""
        if not self.step.replay or layout.prompt_routes_agree(batch[ROUTED_EXPERTS]):
            return True
        self._fallbacks += 1
        return False

    def enter_segment(self, index: int) -> None:
        """Segment ``index`` of a shared-prompt forward runs next (0: the prompts, 1: the responses)."""
        self.tap.enter_segment(index)

    def aux_loss(self) -> torch.Tensor:
        """This rank's load-balancing loss of the latest forward pass (with its gradient); under
        sequence parallelism this rank's part, which adds up over the group to the loss of the rows."""
        group = self.sp.group if self.sp.enabled and self.layout.packed_len is not None else None
        return load_balancing_loss(self.tap.logits, self.tap.selected, self.layout.token_weights(),
                                   self.tap.shape.num_experts, group)

    def count_load(self) -> None:
        """Add the latest forward pass's expert choices (real tokens) to the mini-batch's load."""
        selected = self.tap.selected
        weights = self.layout.token_weights().to(selected[0].device)
        self._counts += expert_counts(selected, weights, self.tap.shape.num_experts).cpu()

    def routes(self) -> torch.Tensor:
        """The latest forward pass's routes as ``[b, S, layers, k]`` int16 (collective under sequence parallelism)."""
        return self.layout.place(self.tap.routes(), self.sp).cpu()

    def load_metrics(self, device: torch.device) -> dict[str, float]:
        """``actor/moe_load_entropy/layer_<i>`` of the load counted since the last call, over all
        data-parallel ranks (collective), and ``actor/moe_shared_prompt_fallback``, the micro-batches
        (``compute_log_prob``'s and the update's) that ran the plain forward for want of equal prompt
        routes since the last call; the counts start again."""
        fallbacks = torch.tensor([float(self._fallbacks)], dtype=torch.float64)
        summed = all_reduce_sum(torch.cat([self._counts.flatten(), fallbacks]).to(device), self.world_size,
                                self.group).cpu()
        counts = summed[:-1].view_as(self._counts)
        self._counts, self._fallbacks = torch.zeros_like(self._counts), 0
        metrics = {f"actor/moe_load_entropy/layer_{i}": float(v) for i, v in enumerate(load_entropy(counts))}
        metrics["actor/moe_shared_prompt_fallback"] = float(summed[-1])
        return metrics

    def stop(self) -> None:
        """Disarm the tap (after the backward passes of an update, or after ``compute_log_prob``)."""
        self.tap.disarm()
        self.layout = None
        self.step = ForwardRouting()
