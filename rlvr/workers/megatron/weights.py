"""Weights in and out of a Megatron stage: HF state -> this rank's shards, and all shards -> HF tensors.

:func:`load_hf_state` copies this rank's slices of a Hugging Face state dict into the stage.
:func:`gather_hf_weights` yields the full HF tensors, one megatron parameter at a time: the
tensor-parallel slices are all-gathered within the stage, then the stage's tensors are broadcast
over the pipeline, so every rank gets every tensor (a collective: all ranks iterate in step); a
LoRA-adapted weight is given merged, ``W + (alpha / r) B A`` (:mod:`~rlvr.workers.megatron.lora`). The
rollout engines' weight sync, ``export_hf`` and ``get_actor_weights`` read it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch
import torch.distributed as dist
from torch import nn
from transformers import PreTrainedModel

from rlvr.workers.megatron.hf_mapping import all_stage_rules, shard_state
from rlvr.workers.megatron.lora import merged_shard
from rlvr.workers.megatron.model import MegatronPolicy, MegatronStage, MegatronValueModel, check_supported
from rlvr.workers.megatron.parallel import MegatronParallel
from rlvr.workers.models import CriticModel

__all__ = ["load_hf_state", "gather_hf_weights", "policy_from_hf", "value_model_from_hf"]


def load_hf_state(model: MegatronStage, hf_state: Mapping[str, torch.Tensor]) -> None:
    """Copy this rank's slices of ``hf_state`` (HF names) into every parameter of ``model``.

    Raises:
        KeyError: a parameter of the stage has no rule, or the state lacks an HF tensor.
    """
    params = dict(model.named_parameters())
    unmapped = sorted(set(params) - set(model.rules))
    if unmapped:
        raise KeyError(f"no Hugging Face mapping for the megatron parameters {unmapped}")
    p = model.parallel
    shards = shard_state(hf_state, model.rules, p.tp, p.tp_rank, p.etp, p.etp_rank)
    with torch.no_grad():
        for name, tensor in shards.items():
            param = params[name]
            if param.shape != tensor.shape:
                raise ValueError(f"{name}: the Hugging Face weights give shape {tuple(tensor.shape)}, "
                                 f"the megatron parameter has {tuple(param.shape)}")
            param.copy_(tensor)
    model.hf_shapes = {name: tuple(t.shape) for name, t in hf_state.items()}


def _all_gather(tensor: torch.Tensor, size: int, group) -> list[torch.Tensor]:
    if group is None:
        return [tensor]
    parts = [torch.empty_like(tensor) for _ in range(size)]
    dist.all_gather(parts, tensor.contiguous(), group=group)
    return parts


def _stage_tensors(model: MegatronStage, params: dict, name: str, rule) -> list[torch.Tensor] | None:
    """The HF tensors of one megatron parameter on this rank's stage: its tensor-parallel slices (an
    expert's: expert-tensor-parallel) all-gathered, an expert's then broadcast from the
    expert-parallel rank that holds it. None on the ranks of other stages."""
    p = model.parallel
    if rule.expert is None:  # a LoRA-adapted weight's shard with its adapter merged in
        local = merged_shard(model, f"gpt.{name}", params[f"gpt.{name}"].detach())
        return rule.unshard(_all_gather(local, p.tp, p.tp_group) if rule.tensor_parallel else [local])
    tensors = None
    if rule.owner == p.ep_rank:
        tensors = rule.unshard(_all_gather(params[f"gpt.{name}"].detach(), p.etp, p.etp_group))
    if p.ep_group is not None:
        if tensors is None:
            shape = model.hf_shapes[rule.hf_names[0]][1:]  # one expert of the fused HF tensor
            tensors = [torch.empty(shape, dtype=model.gpt.config.params_dtype, device=model.inv_freq.device)]
        tensors = [tensors[0].contiguous()]
        dist.broadcast(tensors[0], src=dist.get_global_rank(p.ep_group, rule.owner), group=p.ep_group)
    return tensors


def gather_hf_weights(model: MegatronStage, prefix: str = "model.", lm_head: bool = True
                      ) -> Iterator[tuple[str, torch.Tensor]]:
    """``(HF name, full tensor)`` for every HF weight of the model, on every rank (collective).

    A tied LM head is given once, as the embedding (``<prefix>embed_tokens.weight``); an MoE layer's
    fused expert tensors (``[E, ...]``) once their last expert has been gathered.
    """
    p = model.parallel
    params = dict(model.named_parameters())
    experts: dict[str, list[torch.Tensor]] = {}
    for stage, name, rule in all_stage_rules(model.shape, p.pp, prefix, lm_head):
        tensors = _stage_tensors(model, params, name, rule) if stage == p.pp_rank else None
        if p.pp > 1:
            src = dist.get_global_rank(p.pp_group, stage)
            if tensors is None:
                shapes = [model.hf_shapes[n][1:] if rule.expert is not None else model.hf_shapes[n]
                          for n in rule.hf_names]
                tensors = [torch.empty(shape, dtype=model.gpt.config.params_dtype, device=model.inv_freq.device)
                           for shape in shapes]
            else:
                tensors = [t.contiguous() for t in tensors]
            for tensor in tensors:
                dist.broadcast(tensor, src=src, group=p.pp_group)
        if rule.expert is None:
            yield from zip(rule.hf_names, tensors)
            continue
        name_hf = rule.hf_names[0]
        experts.setdefault(name_hf, []).append(tensors[0])
        if len(experts[name_hf]) == model.shape.num_experts:
            yield name_hf, torch.stack(experts.pop(name_hf))


def _decoder_settings(base_model: nn.Module, parallel: MegatronParallel) -> tuple[torch.Tensor, int | None]:
    """The HF base model's rotary inverse frequencies ``[head_dim / 2]`` and embedding ``padding_idx``
    (after checking that the mapping covers the model in this layout)."""
    rotary = base_model.rotary_emb
    check_supported(base_model.config, float(rotary.attention_scaling), parallel.tp, parallel.ep, parallel.pp,
                    parallel.cp)
    return rotary.inv_freq, base_model.get_input_embeddings().padding_idx


def policy_from_hf(hf_model: PreTrainedModel, parallel: MegatronParallel, overrides: dict | None = None
                   ) -> MegatronPolicy:
    """This rank's stage of the policy, with the weights of the HF causal LM ``hf_model`` (CPU);
    ``overrides``: TransformerConfig fields (:func:`~rlvr.workers.megatron.model.transformer_overrides`)."""
    policy = MegatronPolicy(hf_model.config, *_decoder_settings(hf_model.base_model, parallel), parallel,
                            hf_model.dtype, overrides)
    policy.hf_generation_config = hf_model.generation_config
    load_hf_state(policy, hf_model.state_dict())
    return policy


def value_model_from_hf(critic: CriticModel, parallel: MegatronParallel, overrides: dict | None = None
                        ) -> MegatronValueModel:
    """This rank's stage of the value model, with the weights of rlvr's HF critic (backbone and
    value head, so that both backends start from the same values)."""
    backbone = critic.backbone
    model = MegatronValueModel(backbone.config, *_decoder_settings(backbone, parallel), parallel, backbone.dtype,
                               critic.value_head, overrides)
    load_hf_state(model, critic.state_dict())
    return model
