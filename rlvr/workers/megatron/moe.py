"""Mixture-of-experts decoders on megatron-core: Qwen2-MoE, Qwen3-MoE and Mixtral as ``MoELayer``s.

The HF router (softmax over the experts, the top-k, renormalised or not) is megatron's ``TopKRouter``
with ``moe_router_pre_softmax`` off when the HF model renormalises (top-k of the logits, softmax over
those k: the same weights) and on when it does not (softmax over all experts, then the top-k); the
router runs in float32 (``moe_router_dtype``) as HF's softmax does. The experts are megatron's
``SequentialMLP`` of ``linear_fc1`` (gate and up) and ``linear_fc2``, ``E / ep`` of them on each
expert-parallel rank; Qwen2-MoE's sigmoid-gated shared expert is megatron's ``SharedExpertMLP``
with ``moe_shared_expert_gate``. Tokens reach the experts of other ranks through megatron's
``allgather`` token dispatcher, the one that runs on CPU with gloo (see docs/moe.md for why not
``alltoall``). Megatron's own load-balancing loss is off (``moe_router_load_balancing_type="none"``).

:class:`RlvrTopKRouter` is megatron's router with a gating that leaves the router weight on its
device (megatron's moves a CPU weight to CUDA on every call), and a :class:`MegatronRouterTap` (one
pipeline stage holding every layer): while the tap is armed the router records its choices and logits
and replays given experts (``router_replay``), with megatron's own softmax top-k arithmetic, so the
actor's routing replay, load-balancing loss and expert-load metrics work as on FSDP2
(:mod:`rlvr.workers.moe.actor_routing`). The routers see a stage's tokens sequence-major (``[s * b]``).
"""

from __future__ import annotations

import torch
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.moe.moe_utils import router_gating_linear
from megatron.core.transformer.moe.router import TopKRouter
from megatron.core.transformer.spec_utils import ModuleSpec
from torch import nn
from transformers import PretrainedConfig

from rlvr.workers.moe.routers import MoeShape, RoutingTap, aux_loss_coef

__all__ = ["MOE_MODEL_TYPES", "MegatronRouterTap", "RlvrTopKRouter", "is_moe", "layer_spec", "moe_config_fields",
           "moe_problems", "num_experts", "renormalises"]

MOE_MODEL_TYPES = ("qwen2_moe", "qwen3_moe", "mixtral")
"""The HF mixture-of-experts ``model_type`` values the Megatron mapping covers."""


def is_moe(config: PretrainedConfig) -> bool:
    """Whether the HF config is one of the mixture-of-experts models of :data:`MOE_MODEL_TYPES`."""
    return config.model_type in MOE_MODEL_TYPES


def num_experts(config: PretrainedConfig) -> int:
    """Experts per MoE layer (Mixtral calls them ``num_local_experts``)."""
    return int(config.num_local_experts if config.model_type == "mixtral" else config.num_experts)


def renormalises(config: PretrainedConfig) -> bool:
    """Whether the router divides the top-k probabilities by their sum (Mixtral always)."""
    return config.model_type == "mixtral" or bool(config.norm_topk_prob)


def moe_problems(config: PretrainedConfig, tp: int, pp: int) -> list[str]:
    """What an HF MoE model has that the Megatron mapping does not cover (empty: nothing)."""
    problems = []
    if config.model_type != "mixtral" and (list(config.mlp_only_layers) or config.decoder_sparse_step != 1):
        problems.append("dense MLP layers among the MoE layers (mlp_only_layers / decoder_sparse_step)")
    if config.model_type == "mixtral" and config.router_jitter_noise:
        problems.append("router_jitter_noise (random router inputs in training)")
    if config.output_router_logits and pp > 1:
        problems.append("output_router_logits (the load-balancing loss in the actor's loss) with pipeline stages: rlvr "
                        "adds it on one stage holding every layer only; unset it or use pipeline_model_parallel_size=1")
    if tp > 1:
        problems.append(f"tensor_model_parallel_size={tp} with MoE layers: megatron-core trains MoE layers with "
                        "tensor parallelism only with sequence parallelism, which rlvr's Megatron backend does not "
                        "run; split the experts with expert_model_parallel_size and keep tensor parallelism at 1")
    return problems


def moe_config_fields(config: PretrainedConfig, ep: int, etp: int) -> dict:
    """The ``TransformerConfig`` fields of an HF MoE model (module docstring)."""
    moe_ffn = config.intermediate_size if config.model_type == "mixtral" else config.moe_intermediate_size
    fields = dict(
        num_moe_experts=num_experts(config), moe_router_topk=int(config.num_experts_per_tok),
        moe_ffn_hidden_size=int(moe_ffn), moe_router_pre_softmax=not renormalises(config),
        moe_router_dtype="fp32", moe_router_load_balancing_type="none", moe_aux_loss_coeff=0.0,
        moe_token_dispatcher_type="allgather", moe_grouped_gemm=False, moe_permute_fusion=False,
        expert_model_parallel_size=ep, expert_tensor_parallel_size=etp,
    )
    if config.model_type == "qwen2_moe":
        fields.update(moe_shared_expert_intermediate_size=int(config.shared_expert_intermediate_size),
                      moe_shared_expert_gate=True)
    return fields


class RlvrTopKRouter(TopKRouter):
    """megatron-core's top-k router; its gating keeps the weight on its own device, and it reports to
    (and replays from) its stage's :class:`MegatronRouterTap` while that is armed."""

    tap: RoutingTap | None = None
    tap_layer: int = 0

    def gating(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 - megatron's argument name
        """Router logits ``[..., E]`` of ``input [..., H]`` in the router dtype (float32 here)."""
        dtype = {"fp32": torch.float32, "fp64": torch.float64}.get(self.config.moe_router_dtype, input.dtype)
        return router_gating_linear(input, self.weight, self.bias, dtype)

    def routing(self, logits: torch.Tensor, padding_mask: torch.Tensor | None = None):
        """megatron's routing ``(probs [T, E], routing_map [T, E])``; with the tap armed, the choices are
        recorded and the tap's given experts replace the router's own."""
        probs, routing_map = super().routing(logits, padding_mask)
        tap = self.tap
        if tap is None or not tap.armed:
            return probs, routing_map
        flat = logits.view(-1, self.config.num_moe_experts)
        experts = routing_map.nonzero()[:, 1].view(flat.shape[0], self.topk)  # each row's experts, ascending
        given = tap.given(self.tap_layer, flat.shape[0], flat.device)
        if given is not None:
            experts = torch.where(given[:, :1] >= 0, given, experts)
            probs, routing_map = self._route_to(flat, experts)
        tap.record(self.tap_layer, flat, experts)
        return probs, routing_map

    def _route_to(self, logits: torch.Tensor, experts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The dense ``probs`` and ``routing_map`` ``[T, E]`` of sending each token to ``experts [T, k]``,
        weighted as megatron's softmax top-k weighs its own choice (over the chosen logits, or the chosen
        entries of the softmax over all experts with ``moe_router_pre_softmax``)."""
        if self.config.moe_router_pre_softmax:
            weights = torch.softmax(logits, dim=-1, dtype=torch.float32).gather(1, experts)
        else:
            weights = torch.softmax(logits.gather(1, experts), dim=-1, dtype=torch.float32)
        probs = torch.zeros_like(logits).scatter(1, experts, weights.type_as(logits))
        routing_map = torch.zeros_like(logits, dtype=torch.bool).scatter(1, experts, True)
        return probs, routing_map


class MegatronRouterTap(RoutingTap):
    """The routers of one Megatron stage, seen and steered like an HF model's
    (:class:`~rlvr.workers.moe.routers.RouterTap`); tokens are sequence-major.

    Args:
        stage: the stage's module (its :class:`RlvrTopKRouter` layers, in order).
        config: the HF config (the load-balancing switch and coefficient).
    """

    def __init__(self, stage: nn.Module, config: PretrainedConfig) -> None:
        routers = [module for module in stage.modules() if isinstance(module, RlvrTopKRouter)]
        shape = MoeShape(len(routers), num_experts(config), int(config.num_experts_per_tok))
        super().__init__(shape, aux_loss_coef(config))
        for layer, router in enumerate(routers):
            router.tap, router.tap_layer = self, layer


def layer_spec(config: PretrainedConfig) -> ModuleSpec:
    """The decoder layer spec: megatron-core's local spec, with MoE layers and rlvr's router for an
    MoE model and per-head query/key RMSNorm for Qwen3-MoE."""
    if not is_moe(config):
        return get_gpt_layer_local_spec(normalization="RMSNorm")
    spec = get_gpt_layer_local_spec(num_experts=num_experts(config), moe_grouped_gemm=False,
                                    qk_layernorm=config.model_type == "qwen3_moe", normalization="RMSNorm")
    spec.submodules.mlp.submodules.router = RlvrTopKRouter
    return spec
