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
device (megatron's moves a CPU weight to CUDA on every call).
"""

from __future__ import annotations

import torch
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.moe.moe_utils import router_gating_linear
from megatron.core.transformer.moe.router import TopKRouter
from megatron.core.transformer.spec_utils import ModuleSpec
from transformers import PretrainedConfig

__all__ = ["MOE_MODEL_TYPES", "RlvrTopKRouter", "is_moe", "layer_spec", "moe_config_fields", "moe_problems",
           "num_experts", "renormalises"]

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


def moe_problems(config: PretrainedConfig, tp: int) -> list[str]:
    """What an HF MoE model has that the Megatron mapping does not cover (empty: nothing)."""
    problems = []
    if config.model_type != "mixtral" and (list(config.mlp_only_layers) or config.decoder_sparse_step != 1):
        problems.append("dense MLP layers among the MoE layers (mlp_only_layers / decoder_sparse_step)")
    if config.model_type == "mixtral" and config.router_jitter_noise:
        problems.append("router_jitter_noise (random router inputs in training)")
    if config.output_router_logits:
        problems.append("output_router_logits (the load-balancing loss in the actor's loss): rlvr's Megatron backend "
                        "trains without it (megatron-core's own is off); unset it or use strategy=fsdp2")
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
    """megatron-core's top-k router; its gating keeps the weight on its own device."""

    def gating(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 - megatron's argument name
        """Router logits ``[..., E]`` of ``input [..., H]`` in the router dtype (float32 here)."""
        dtype = {"fp32": torch.float32, "fp64": torch.float64}.get(self.config.moe_router_dtype, input.dtype)
        return router_gating_linear(input, self.weight, self.bias, dtype)


def layer_spec(config: PretrainedConfig) -> ModuleSpec:
    """The decoder layer spec: megatron-core's local spec, with MoE layers and rlvr's router for an
    MoE model and per-head query/key RMSNorm for Qwen3-MoE."""
    if not is_moe(config):
        return get_gpt_layer_local_spec(normalization="RMSNorm")
    spec = get_gpt_layer_local_spec(num_experts=num_experts(config), moe_grouped_gemm=False,
                                    qk_layernorm=config.model_type == "qwen3_moe", normalization="RMSNorm")
    spec.submodules.mlp.submodules.router = RlvrTopKRouter
    return spec
