"""megatron-core models of a Hugging Face Llama/Qwen2 or MoE checkpoint: the policy and the value model.

A :class:`MegatronStage` is this rank's pipeline stage of a ``GPTModel`` built with megatron-core's
local layer spec (no transformer-engine, no apex): ``ColumnParallelLinear`` / ``RowParallelLinear``
projections, a ``VocabParallelEmbedding``, ``torch.nn.RMSNorm``, grouped-query ``DotProductAttention``.
Its weights come from the HF model through :mod:`rlvr.workers.megatron.hf_mapping`; a
mixture-of-experts model's layers are megatron's ``MoELayer`` (:mod:`rlvr.workers.megatron.moe`).

Rotary embeddings: the model is built with ``position_embedding_type="none"`` and the decoder gets
the rotary angles of each row's ``position_ids`` (``[s, b, 1, head_dim]``, the HF model's own
``inv_freq``, so RoPE scaling variants carry over), which reproduces the HF forward on left-padded
batches exactly. The attention mask (``[b, 1, s, s]``, True = masked) is causal and hides padding.

Activations are ``[seq, batch, hidden]`` inside megatron; the helpers here take and return
``[batch, seq]`` tensors like the FSDP workers. With context parallelism (``cp > 1``) a stage runs
only this rank's positions of every (padded) sequence and attends over the keys of all of them
(:mod:`~rlvr.workers.megatron.context_parallel`).
"""

from __future__ import annotations

from contextlib import AbstractContextManager

import torch
import torch.nn.functional as F
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.transformer.transformer_config import TransformerConfig
from torch import nn
from transformers import PretrainedConfig

from rlvr.workers.megatron.context_parallel import ContextParallelAttention
from rlvr.workers.megatron.hf_mapping import SUPPORTED_MODEL_TYPES, LlamaShape, Rule, stage_layers, stage_rules
from rlvr.workers.megatron.lora import adapters_disabled
from rlvr.workers.megatron.moe import MegatronRouterTap, is_moe, layer_spec, moe_config_fields, moe_problems
from rlvr.workers.megatron.parallel import MegatronParallel
from rlvr.workers.megatron.pipeline import receive_forward, send_forward

__all__ = ["check_supported", "MegatronStage", "MegatronPolicy", "MegatronValueModel", "transformer_overrides",
           "RECOMPUTE_ALL_LAYERS"]


def check_supported(config: PretrainedConfig, attention_scaling: float, tp: int = 1, ep: int = 1, pp: int = 1,
                    cp: int = 1) -> None:
    """Raise ``ValueError`` naming what an HF model has that the Megatron mapping does not cover (with
    ``tp`` tensor-parallel, ``ep`` expert-parallel ranks, ``pp`` pipeline stages and ``cp``
    context-parallel ranks)."""
    problems = []
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        problems.append(f"model_type {config.model_type!r} (supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    if getattr(config, "hidden_act", "silu") != "silu":
        problems.append(f"hidden_act {config.hidden_act!r} (only silu)")
    if config.model_type == "llama" and (config.attention_bias or config.mlp_bias):
        problems.append("attention_bias/mlp_bias (Llama projections without biases only)")
    if getattr(config, "use_sliding_window", False):
        problems.append("use_sliding_window")
    if attention_scaling != 1.0:
        problems.append(f"a RoPE variant that scales attention ({attention_scaling})")
    if is_moe(config):
        problems += moe_problems(config, tp, pp)
        if cp > 1:
            problems.append(f"context_parallel_size={cp} with a mixture-of-experts model (rlvr's router tap, which "
                            "the routing replay, the load-balancing loss and the expert-load metrics read, sees whole "
                            "sequences, not a context-parallel rank's chunks); set context_parallel_size=1")
    elif ep > 1:
        problems.append(f"expert_model_parallel_size={ep} for a model without experts; set it to 1")
    if problems:
        raise ValueError("strategy=megatron cannot run this model: " + "; ".join(problems))


RECOMPUTE_ALL_LAYERS = {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
"""``model.enable_gradient_checkpointing`` on Megatron: every decoder layer recomputes its
activations in backward (megatron-core's full uniform recompute, one layer per checkpoint)."""


def transformer_overrides(megatron_config, model_config) -> dict:
    """The TransformerConfig fields a role sets: ``RECOMPUTE_ALL_LAYERS`` with
    ``model.enable_gradient_checkpointing``, then ``megatron.override_transformer_config`` (its
    entries win; None entries keep megatron-core's default)."""
    overrides = dict(RECOMPUTE_ALL_LAYERS) if model_config.enable_gradient_checkpointing else {}
    overrides.update({key: value for key, value in dict(megatron_config.override_transformer_config).items()
                      if value is not None})
    return overrides


def _transformer_config(config: PretrainedConfig, shape: LlamaShape, parallel: MegatronParallel,
                        dtype: torch.dtype, overrides: dict | None = None) -> TransformerConfig:
    return TransformerConfig(**{**_base_fields(config, shape, parallel, dtype), **(overrides or {})})


def _base_fields(config: PretrainedConfig, shape: LlamaShape, parallel: MegatronParallel, dtype: torch.dtype) -> dict:
    moe = moe_config_fields(config, parallel.ep, parallel.etp) if is_moe(config) else {}
    return dict(
        num_layers=shape.num_layers, hidden_size=config.hidden_size, ffn_hidden_size=config.intermediate_size,
        num_attention_heads=shape.num_heads, num_query_groups=shape.num_kv_heads, kv_channels=shape.head_dim,
        normalization="RMSNorm", layernorm_epsilon=config.rms_norm_eps, gated_linear_unit=True,
        activation_func=F.silu, add_bias_linear=False, add_qkv_bias=shape.qkv_bias, hidden_dropout=0.0,
        attention_dropout=float(getattr(config, "attention_dropout", 0.0)),
        tensor_model_parallel_size=parallel.tp, pipeline_model_parallel_size=parallel.pp,
        params_dtype=dtype, pipeline_dtype=dtype, bf16=dtype == torch.bfloat16, attention_softmax_in_fp32=True,
        use_cpu_initialization=True, perform_initialization=False, masked_softmax_fusion=False,
        bias_activation_fusion=False, bias_dropout_fusion=False, apply_rope_fusion=False,
        gradient_accumulation_fusion=False, persist_layer_norm=False, sequence_parallel=False,
        qk_layernorm=shape.qk_norm, **moe,
    )


class MegatronStage(nn.Module):
    """This rank's pipeline stage of the decoder (embedding on the first stage, final norm on the last).

    Args:
        config: the HF model config.
        inv_freq: ``[head_dim / 2]`` the HF model's rotary inverse frequencies.
        padding_idx: the HF embedding's ``padding_idx`` (its row gets no gradient from lookups).
        parallel: the layout.
        dtype: parameter dtype.
        lm_head: build the (vocabulary-parallel) LM head on the last stage.
        prefix: HF prefix of the decoder's weights (see :func:`~rlvr.workers.megatron.hf_mapping.stage_rules`).
        overrides: TransformerConfig fields of the role (:func:`transformer_overrides`).
    """

    def __init__(self, config: PretrainedConfig, inv_freq: torch.Tensor, padding_idx: int | None,
                 parallel: MegatronParallel, dtype: torch.dtype, lm_head: bool, prefix: str,
                 overrides: dict | None = None) -> None:
        super().__init__()
        self.parallel = parallel
        self.padding_idx = padding_idx
        self.hf_config = config
        self.shape = LlamaShape.from_hf_config(config, parallel.tp, parallel.ep)
        stage_layers(self.shape.num_layers, parallel.pp, parallel.pp_rank)  # checks the split
        spec = layer_spec(config)
        if parallel.cp > 1:  # megatron's own context-parallel attention is transformer-engine's (CUDA)
            spec.submodules.self_attention.submodules.core_attention = ContextParallelAttention
        self.gpt = GPTModel(
            _transformer_config(config, self.shape, parallel, dtype, overrides), spec,
            vocab_size=self.shape.padded_vocab, max_sequence_length=config.max_position_embeddings,
            pre_process=parallel.first_stage, post_process=parallel.last_stage,
            share_embeddings_and_output_weights=self.shape.tied and parallel.pp == 1,
            position_embedding_type="none",
        )
        if parallel.last_stage and not lm_head:
            self.gpt.output_layer = None
        # the routers' tap (an MoE model on one stage): the actor's routing replay, loss and metrics
        self.router_tap = MegatronRouterTap(self.gpt, config) if is_moe(config) and parallel.pp == 1 else None
        self.register_buffer("inv_freq", inv_freq.float().clone(), persistent=False)
        self.hf_shapes: dict[str, tuple[int, ...]] = {}  # of the HF weights, recorded when they are loaded
        self.rules: dict[str, Rule] = {
            f"gpt.{name}": rule for name, rule in stage_rules(self.shape, parallel.pp, parallel.pp_rank, prefix,
                                                                lm_head, parallel.ep_rank).items()
        }

    def disable_adapter(self) -> AbstractContextManager[None]:
        """A block in which the stage runs without its LoRA adapters (peft's name; the reference of a
        LoRA run, :func:`~rlvr.workers.megatron.lora.adapters_disabled`)."""
        return adapters_disabled(self)

    def _rotary(self, position_ids: torch.Tensor) -> torch.Tensor:
        """``[s, b, 1, head_dim]`` rotary angles of ``position_ids [b, s]`` (HF's ``cat(freqs, freqs)``)."""
        freqs = position_ids[..., None].float() * self.inv_freq
        return torch.cat([freqs, freqs], dim=-1).transpose(0, 1)[:, :, None, :]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
                ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Run this stage on ``[b, s]`` inputs.

        Returns:
            ``(hidden, link)``: on the last stage the final-normed hidden states ``[s, b, H]`` (with
            ``cp > 1``: ``[padded / cp, b, H]`` of this rank's positions of the sequences padded on the
            right to ``padded = cp.padded_length(s)``), else None; ``link`` is a zero scalar to add
            to the loss (see :mod:`~rlvr.workers.megatron.pipeline`).
        """
        p, cp = self.parallel, self.parallel.context
        b, s = input_ids.shape
        keys = attention_mask.bool()
        local = torch.arange(s, device=input_ids.device)
        if cp.size > 1:  # this rank's positions; the right padding is masked out as keys
            pad = cp.padded_length(s) - s
            input_ids, position_ids, keys = (F.pad(t, (0, pad)) for t in (input_ids, position_ids, keys))
            local = cp.positions(s + pad).to(input_ids.device)
            input_ids, position_ids = input_ids[:, local], position_ids[:, local]
            s = len(local)
        causal = torch.arange(keys.shape[1], device=keys.device)[None, :] <= local[:, None]  # [s, all keys]
        masked = ~(causal[None] & keys[:, None, :])[:, None]  # [b, 1, s, all keys]
        if p.first_stage:
            hidden = self.gpt.embedding(input_ids=input_ids, position_ids=position_ids)
            if self.padding_idx is not None:  # as HF's nn.Embedding(padding_idx): lookups of it do not train it
                hidden = torch.where((input_ids == self.padding_idx).transpose(0, 1)[..., None], hidden.detach(), hidden)
        else:
            hidden = receive_forward((s, b, self.hf_config.hidden_size), self.gpt.config.params_dtype,
                                     input_ids.device, p.prev_rank)
            self.gpt.decoder.set_input_tensor(hidden)  # a later stage's decoder reads its input from here
        hidden = self.gpt.decoder(hidden_states=hidden, attention_mask=masked,
                                  rotary_pos_emb=self._rotary(position_ids))
        if p.last_stage:
            return hidden, hidden.new_zeros(())
        return None, send_forward(hidden, p.next_rank)


class MegatronPolicy(MegatronStage):
    """The policy: decoder stage plus the vocabulary-parallel LM head on the last stage."""

    def __init__(self, config: PretrainedConfig, inv_freq: torch.Tensor, padding_idx: int | None,
                 parallel: MegatronParallel, dtype: torch.dtype, overrides: dict | None = None) -> None:
        super().__init__(config, inv_freq, padding_idx, parallel, dtype, lm_head=True, prefix="model.",
                         overrides=overrides)
        self.hf_generation_config = None  # the HF model's, for export_hf (set by policy_from_hf)

    @property
    def vocab_start(self) -> int:
        """First vocabulary id of this rank's slice of the LM head."""
        return self.parallel.tp_rank * self.shape.padded_vocab // self.parallel.tp

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """This rank's vocabulary slice of the logits ``[s, b, vocab / tp]`` of hidden states ``[s, b, H]``."""
        weight = self.gpt.shared_embedding_or_output_weight() if self.gpt.share_embeddings_and_output_weights else None
        logits, _ = self.gpt.output_layer(hidden, weight=weight)
        return logits


class MegatronValueModel(MegatronStage):
    """The critic: decoder stage plus a scalar value head (replicated over tensor-parallel ranks).

    Args:
        value_head: the HF critic's ``nn.Linear(hidden, 1)`` (the same initial weights as FSDP's).
    """

    def __init__(self, config: PretrainedConfig, inv_freq: torch.Tensor, padding_idx: int | None,
                 parallel: MegatronParallel, dtype: torch.dtype, value_head: nn.Linear,
                 overrides: dict | None = None) -> None:
        super().__init__(config, inv_freq, padding_idx, parallel, dtype, lm_head=False, prefix="backbone.",
                         overrides=overrides)
        self.value_head = value_head if parallel.last_stage else None
        if self.value_head is not None:
            for name in ("weight", "bias"):
                self.rules[f"value_head.{name}"] = Rule("replicated", (f"value_head.{name}",), self.shape)

    def values(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[b, s]`` float32 values of hidden states ``[s, b, H]``."""
        return self.value_head(hidden).squeeze(-1).transpose(0, 1).float()
