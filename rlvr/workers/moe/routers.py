"""The routers of transformers' mixture-of-experts models, seen and steered from outside.

transformers (5.x) gives every sparse MoE block a router module whose forward maps the block's
tokens ``[T, hidden]`` to ``(router_logits [T, E], weights [T, k], experts [T, k])``: a softmax over
the ``E`` experts, the ``k`` most probable of them, and (depending on the model) their
probabilities renormalised to sum to 1. :data:`SOFTMAX_TOP_K_ROUTERS` lists the router classes of
that family that rlvr supports (Qwen2-MoE, Qwen3-MoE, Mixtral, OLMoE) and whether each renormalises.

:class:`RouterTap` puts a forward hook on every such router of a model. While armed it keeps, per MoE
layer, the experts every token went to (and, for the load-balancing loss, the router logits) of the
latest forward pass, and it can *replay* given choices: a token whose experts are given goes to
those experts, weighted by the router's own probabilities of them (renormalised as the model
does), instead of its own top-k. When the given experts are the router's own choices, in the same
order, the weights are the same numbers and the forward pass is bit-for-bit the one without replay.
Tokens given as ``-1`` keep their own choice (padding, or tokens the rollout never ran).

A tap is made once per model (:func:`router_tap`) and shared by whatever runs the model: the actor
and, when it shares the actor's module, the rollout engine. It takes over the model's load-balancing
loss: the config's switch for it (``output_router_logits``, with ``router_aux_loss_coef``) becomes
the tap's :attr:`RouterTap.aux_loss_coef` and is turned off in the model, whose own loss would run in
every forward pass, decode steps included (where transformers 5.24's fails on the KV cache's mask). Activation checkpointing runs a
layer's forward again during the backward pass; the tap stays armed until the next
:meth:`RouterTap.arm` (or :meth:`RouterTap.disarm`), so the recomputation replays the same
choices.

A forward pass may run in *segments*, one call of the model after another (the actor's shared-prompt
forward: the distinct prompts, then every row's response on their KV cache). Armed with the tokens
of each segment, the tap replays and records segment by segment (:meth:`RoutingTap.enter_segment`
says which one runs) and :attr:`RoutingTap.selected` / :attr:`RoutingTap.logits` hold the segments'
tokens one after the other, as if one forward pass had run them all.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import torch
from peft import PeftModel
from torch import nn
from transformers import PreTrainedModel
from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter
from transformers.models.olmoe.modeling_olmoe import OlmoeTopKRouter
from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeTopKRouter
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

from rlvr.workers.models import unwrap_hf_model

__all__ = ["SOFTMAX_TOP_K_ROUTERS", "MoeShape", "RoutingTap", "RouterTap", "aux_loss_coef", "has_routers", "router_tap",
           "replayed_weights"]


def _own_setting(router: nn.Module) -> bool:
    return bool(router.norm_topk_prob)


def _always(router: nn.Module) -> bool:
    return True


SOFTMAX_TOP_K_ROUTERS: dict[type, Callable[[nn.Module], bool]] = {
    Qwen2MoeTopKRouter: _own_setting,
    Qwen3MoeTopKRouter: _own_setting,
    OlmoeTopKRouter: _own_setting,
    MixtralTopKRouter: _always,
}
"""Router class -> ``renormalises(router)``: whether the chosen experts' probabilities are divided by
their sum (Qwen and OLMoE: the config's ``norm_topk_prob``; Mixtral: always)."""


@dataclass(frozen=True)
class MoeShape:
    """The routing of a model: ``layers`` MoE layers (routers, in forward order), ``num_experts``
    experts each, ``top_k`` of them per token."""

    layers: int
    num_experts: int
    top_k: int


def replayed_weights(router_logits: torch.Tensor, experts: torch.Tensor, renormalise: bool,
                     dtype: torch.dtype) -> torch.Tensor:
    """The weights a softmax top-k router gives the ``experts`` it is told to use.

    Args:
        router_logits: ``[T, E]``.
        experts: ``[T, k]`` int64 expert ids.
        renormalise: divide the chosen probabilities by their sum.
        dtype: the router's output dtype.

    Returns:
        ``[T, k]``: the same arithmetic as the router's own (softmax in float32, then the chosen
        entries), so for its own choices the same numbers.
    """
    weights = torch.softmax(router_logits, dim=-1, dtype=torch.float32).gather(-1, experts)
    if renormalise:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(dtype)


class RoutingTap:
    """What a forward pass's routers chose, and the choices to replay: the state every tap shares.

    Attributes:
        shape: the model's :class:`MoeShape`.
        aux_loss_coef: the coefficient of the load-balancing loss the model config asks for (0: none).
    """

    def __init__(self, shape: MoeShape, aux_loss_coef: float) -> None:
        self.shape = shape
        self.aux_loss_coef = aux_loss_coef
        self.armed = False
        self._replay: torch.Tensor | None = None
        self._keep_logits = False
        self._bounds: list[int] | None = None
        self._reset(1)

    def _reset(self, segments: int) -> None:
        self._segment = 0
        self._selected: list[list[torch.Tensor | None]] = [[None] * self.shape.layers for _ in range(segments)]
        self._logits: list[list[torch.Tensor | None]] = [[None] * self.shape.layers for _ in range(segments)]

    def arm(self, replay: torch.Tensor | None = None, keep_logits: bool = False,
            segments: Sequence[int] | None = None) -> None:
        """Record the routing of the forward passes from now on (until the next ``arm`` or ``disarm``).

        Args:
            replay: ``[T, layers, k]`` int experts to use instead of the routers' own choices, ``-1``
                for a token that keeps its own; ``T`` must be the tokens of every router call (the
                forward pass's tokens, flattened in the order the routers see them; with ``segments``,
                the segments' tokens one after the other). None: the routers choose.
            keep_logits: also keep the router logits (for the load-balancing loss).
            segments: the tokens of each segment of a forward pass that runs in several calls of the
                model (module docstring); the first runs until :meth:`enter_segment` names another.
                None: one forward pass, one segment.
        """
        if replay is not None and tuple(replay.shape[1:]) != (self.shape.layers, self.shape.top_k):
            raise ValueError(f"routing replay: routes of shape [tokens, layers, k] = [*, {self.shape.layers}, "
                             f"{self.shape.top_k}] expected, got {list(replay.shape)}")
        if segments is not None and replay is not None and replay.shape[0] != sum(segments):
            raise ValueError(f"routing replay: routes for {replay.shape[0]} tokens given, but the forward's "
                             f"segments hold {list(segments)} = {sum(segments)} tokens")
        self.armed = True
        self._replay = None if replay is None else replay.long()
        self._keep_logits = keep_logits
        self._bounds = None if segments is None else [0, *itertools.accumulate(segments)]
        self._reset(1 if segments is None else len(segments))

    def enter_segment(self, index: int) -> None:
        """The forward's segment ``index`` runs next (armed with ``segments``)."""
        if self._bounds is None or not 0 <= index < len(self._bounds) - 1:
            raise ValueError(f"segment {index} of a forward pass armed with segment bounds {self._bounds}")
        self._segment = index

    def disarm(self) -> None:
        """Stop recording and replaying; drop what was kept."""
        self.armed, self._replay, self._keep_logits, self._bounds = False, None, False, None
        self._reset(1)

    @property
    def selected(self) -> list[torch.Tensor | None]:
        """Per MoE layer, ``[T, k]`` the experts of every token in the latest armed forward (the
        segments' tokens one after the other); None for a layer some segment has not run through."""
        return [_joined(parts) for parts in zip(*self._selected, strict=True)]

    @property
    def logits(self) -> list[torch.Tensor | None]:
        """Per MoE layer, ``[T, E]`` the router logits of the latest armed forward (with their
        gradient), when armed with ``keep_logits``; laid out as :attr:`selected`."""
        return [_joined(parts) for parts in zip(*self._logits, strict=True)]

    def routes(self) -> torch.Tensor:
        """``[T, layers, k]`` int64 the experts of every token in every MoE layer, latest forward."""
        selected = self.selected
        if any(chosen is None for chosen in selected):
            raise RuntimeError("no armed forward pass has run through every router since the tap was armed")
        return torch.stack(selected, dim=1)

    def given(self, layer: int, tokens: int, device: torch.device) -> torch.Tensor | None:
        """``[tokens, k]`` the experts to replay in MoE layer ``layer`` (``-1``: the router's own), or None."""
        if self._replay is None:
            return None
        replay = self._replay
        if self._bounds is not None:
            replay = replay[self._bounds[self._segment] : self._bounds[self._segment + 1]]
        given = replay[:, layer].to(device)
        if given.shape[0] != tokens:
            raise ValueError(f"routing replay: the router of MoE layer {layer} routes {tokens} tokens but routes "
                             f"for {given.shape[0]} tokens were given")
        return given

    def record(self, layer: int, logits: torch.Tensor, experts: torch.Tensor) -> None:
        """Keep MoE layer ``layer``'s choices ``[T, k]`` (and logits ``[T, E]`` when asked) of the running segment."""
        self._selected[self._segment][layer] = experts.detach()
        if self._keep_logits:
            self._logits[self._segment][layer] = logits


def _joined(parts: tuple[torch.Tensor | None, ...]) -> torch.Tensor | None:
    """The segments' tensors one after the other (None when one is missing)."""
    if any(part is None for part in parts):
        return None
    return parts[0] if len(parts) == 1 else torch.cat(parts)


class RouterTap(RoutingTap):
    """Forward hooks on the routers of a transformers MoE model (module docstring).

    Args:
        model: the Hugging Face model (plain or FSDP2-sharded); it must have at least one router of
            :data:`SOFTMAX_TOP_K_ROUTERS`.
    """

    def __init__(self, model: nn.Module) -> None:
        routers = [module for module in model.modules() if type(module) in SOFTMAX_TOP_K_ROUTERS]
        if not routers:
            raise ValueError(f"{type(model).__name__} has no mixture-of-experts router rlvr knows "
                             f"({', '.join(cls.__name__ for cls in SOFTMAX_TOP_K_ROUTERS)})")
        text_config = model.config.get_text_config()
        super().__init__(MoeShape(len(routers), int(routers[0].num_experts), int(routers[0].top_k)),
                         aux_loss_coef(text_config))
        text_config.output_router_logits = False
        for layer, router in enumerate(routers):
            renormalise = SOFTMAX_TOP_K_ROUTERS[type(router)](router)
            router.register_forward_hook(partial(self._on_router, layer, renormalise))

    def _on_router(self, layer: int, renormalise: bool, module: nn.Module, args: tuple, output: tuple):
        if not self.armed:
            return None
        logits, weights, experts = output
        given = self.given(layer, experts.shape[0], experts.device)
        if given is not None:
            experts = torch.where(given[:, :1] >= 0, given, experts)
            weights = replayed_weights(logits, experts, renormalise, weights.dtype)
            output = (logits, weights, experts)
        self.record(layer, logits, experts)
        return output


def aux_loss_coef(text_config) -> float:
    """The load-balancing loss coefficient an HF MoE config asks for: its ``router_aux_loss_coef`` when
    ``output_router_logits`` is set (transformers' own switch for adding it to the loss), else 0."""
    return float(text_config.router_aux_loss_coef) if text_config.output_router_logits else 0.0


_TAPS: weakref.WeakKeyDictionary[nn.Module, RouterTap] = weakref.WeakKeyDictionary()


def has_routers(module: nn.Module) -> bool:
    """Whether ``module`` contains a mixture-of-experts router of :data:`SOFTMAX_TOP_K_ROUTERS`."""
    return any(type(sub) in SOFTMAX_TOP_K_ROUTERS for sub in module.modules())


def router_tap(module: nn.Module) -> RouterTap | None:
    """The :class:`RouterTap` of the Hugging Face model in ``module`` (a ``PreTrainedModel`` or peft
    model), made on first use; None for a model without MoE routers (dense) or a module that is not
    a Hugging Face model (Megatron's)."""
    if not isinstance(module, (PreTrainedModel, PeftModel)):
        return None
    model = unwrap_hf_model(module)
    if model not in _TAPS:
        if not has_routers(model):
            return None
        _TAPS[model] = RouterTap(model)
    return _TAPS[model]
