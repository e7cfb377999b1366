"""Hugging Face Llama/Qwen2 and MoE weights <-> megatron-core ``GPTModel`` shards (tensor, pipeline and
expert parallel).

Pure torch: no megatron import, no collective. One :class:`Rule` per megatron parameter says which
HF tensors it is made of and how it is cut over ``tp`` tensor-parallel ranks:

- ``replicated`` (RMSNorm weights): every rank holds the HF tensor;
- ``rows`` / ``cols``: split along dim 0 (column-parallel output) or dim 1 (row-parallel input);
- ``vocab``: rows of the embedding / LM head, padded with zero rows to ``padded_vocab`` (a multiple
  of ``tp``) and split along dim 0;
- ``qkv``: HF ``q_proj``/``k_proj``/``v_proj`` fused *per query group*: group ``g`` is the rows of
  its ``heads // groups`` query heads, then its key head, then its value head; rank ``r`` holds
  groups ``r * groups/tp ... (r+1) * groups/tp - 1`` (weights ``[rows, hidden]`` and biases alike);
- ``gate_up``: HF ``gate_proj`` and ``up_proj`` fused *per rank*: rank ``r`` holds its slice of
  gate rows followed by its slice of up rows (megatron's SwiGLU splits its fc1 output in halves).

Mixture-of-experts layers (Qwen2-MoE, Qwen3-MoE, Mixtral): the HF router ``mlp.gate`` is megatron's
``mlp.router`` (``replicated``); HF keeps the experts fused, ``mlp.experts.gate_up_proj [E, 2I, H]``
(gate rows, then up rows) and ``mlp.experts.down_proj [E, H, I]``; megatron holds ``E / ep`` of them
on each expert-parallel rank, expert ``e`` on rank ``e // (E / ep)`` as ``local_experts.<e mod E/ep>``
(``expert_gate_up``: expert ``e``'s gate and up rows cut over the ``etp`` expert-tensor-parallel
ranks like ``gate_up``; ``expert_down``: its ``down`` columns cut like ``cols``). Qwen2-MoE's shared
expert is ``mlp.shared_experts`` (``gate_up`` and ``cols``) with its sigmoid gate ``gate_weight``
(``replicated``); Qwen3-MoE's per-head query/key RMSNorms are ``q_layernorm``/``k_layernorm``.

Pipeline stage ``s`` of ``pp`` holds decoder layers ``s * L/pp ... (s+1) * L/pp - 1`` under local
indices ``0 ... L/pp - 1``; the first stage holds the embedding, the last the final norm and the
LM head. Tied embeddings (``tie_word_embeddings``): with one stage the head reuses the embedding
(no ``output_layer.weight``); with several, the last stage holds a copy (``output_layer.weight``)
whose gradient is summed with the embedding's (see :mod:`rlvr.workers.megatron.grads`).

``shard(unshard(...))`` and ``unshard(shard(...))`` are exact (slicing and concatenation only), so
HF -> Megatron -> HF is bit-exact.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

__all__ = ["LlamaShape", "Rule", "stage_layers", "stage_rules", "all_stage_rules", "shard_state", "SUPPORTED_MODEL_TYPES"]

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen2_moe", "qwen3_moe", "mixtral")
"""HF ``model_type`` values this mapping covers (the Llama architecture; Qwen2 adds q/k/v biases; the
mixture-of-experts models of the module docstring)."""


@dataclass(frozen=True)
class LlamaShape:
    """The dimensions of a Llama-family decoder that the mapping needs.

    Attributes:
        num_layers: decoder layers ``L``.
        num_heads / num_kv_heads: query heads and key/value heads (query groups).
        head_dim: width of one head.
        vocab_size / padded_vocab: HF vocabulary and its size padded to a multiple of ``tp``.
        tied: ``tie_word_embeddings`` (the LM head is the embedding).
        qkv_bias: q/k/v projections have biases (Qwen2, Qwen2-MoE).
        num_experts: experts per MoE layer (0: a dense model).
        ep: expert-parallel ranks (each holds ``num_experts / ep`` experts).
        qk_norm: per-head query/key RMSNorms (Qwen3-MoE).
        shared_expert: a sigmoid-gated shared expert beside the routed ones (Qwen2-MoE).
    """

    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    padded_vocab: int
    tied: bool
    qkv_bias: bool
    num_experts: int = 0
    ep: int = 1
    qk_norm: bool = False
    shared_expert: bool = False

    @classmethod
    def from_hf_config(cls, config, tp: int, ep: int = 1) -> LlamaShape:
        """The shape of an HF config of :data:`SUPPORTED_MODEL_TYPES` cut over ``tp`` ranks (vocab
        padded) and, for an MoE model, its experts over ``ep`` ranks."""
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        vocab = config.vocab_size
        experts = {"mixtral": "num_local_experts", "qwen2_moe": "num_experts", "qwen3_moe": "num_experts"}
        num_experts = int(getattr(config, experts[config.model_type])) if config.model_type in experts else 0
        if num_experts % ep:
            raise ValueError(f"{num_experts} experts cannot be split evenly over expert_model_parallel_size={ep}")
        return cls(
            num_layers=config.num_hidden_layers, num_heads=heads,
            num_kv_heads=config.num_key_value_heads or heads, head_dim=head_dim, vocab_size=vocab,
            padded_vocab=-(-vocab // tp) * tp, tied=bool(config.tie_word_embeddings),
            qkv_bias=config.model_type in ("qwen2", "qwen2_moe"), num_experts=num_experts, ep=ep,
            qk_norm=config.model_type == "qwen3_moe", shared_expert=config.model_type == "qwen2_moe",
        )

    @property
    def local_experts(self) -> int:
        """Experts on one expert-parallel rank."""
        return self.num_experts // self.ep


def _split(tensor: torch.Tensor, parts: int, dim: int) -> list[torch.Tensor]:
    if tensor.shape[dim] % parts:
        raise ValueError(f"cannot split a tensor of shape {tuple(tensor.shape)} into {parts} equal parts along dim {dim}")
    return list(torch.chunk(tensor, parts, dim=dim))


@dataclass(frozen=True)
class Rule:
    """How one megatron parameter is made of HF tensors.

    Attributes:
        kind: ``replicated | rows | cols | vocab | qkv | gate_up | expert_gate_up | expert_down`` (see the
            module docstring).
        hf_names: the HF parameter names, in the order :meth:`shard` takes them.
        shape: the model's shape (for heads and vocab sizes).
        expert: the expert (global index) of an ``expert_*`` rule; its slice of the fused HF tensor.
    """

    kind: str
    hf_names: tuple[str, ...]
    shape: LlamaShape
    expert: int | None = None

    @property
    def tensor_parallel(self) -> bool:
        """Whether the ranks hold different slices (False: every rank holds the same tensor); an expert's
        slices are over the expert-tensor-parallel ranks."""
        return self.kind != "replicated"

    @property
    def owner(self) -> int:
        """The expert-parallel rank that holds an expert rule's expert (0 for the other rules)."""
        return 0 if self.expert is None else self.expert // self.shape.local_experts

    def shard(self, hf: Sequence[torch.Tensor], tp: int, rank: int) -> torch.Tensor:
        """Rank ``rank``'s slice of the fused megatron tensor, from the HF tensors ``hf`` (``tp``, ``rank``:
        the expert-tensor-parallel size and rank for an expert rule)."""
        if self.kind == "expert_gate_up":
            gate, up = _split(hf[0][self.expert], 2, 0)
            return Rule("gate_up", (), self.shape).shard([gate, up], tp, rank)
        if self.kind == "expert_down":
            return _split(hf[0][self.expert], tp, 1)[rank].clone()
        if self.kind == "replicated":
            return hf[0].clone()
        if self.kind in ("rows", "cols"):
            return _split(hf[0], tp, 0 if self.kind == "rows" else 1)[rank].clone()
        if self.kind == "vocab":
            padded = torch.zeros((self.shape.padded_vocab, *hf[0].shape[1:]), dtype=hf[0].dtype)
            padded[: hf[0].shape[0]] = hf[0]
            return _split(padded, tp, 0)[rank].clone()
        if self.kind == "gate_up":
            gate, up = (_split(t, tp, 0)[rank] for t in hf)
            return torch.cat([gate, up]).clone()
        return self._shard_qkv(hf, tp, rank)

    def unshard(self, shards: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The HF tensors (in :attr:`hf_names` order) from the slices of all ``tp`` ranks
        (``[local]`` is enough for a replicated parameter); for an expert rule, the expert's slice of
        the fused HF tensor (``[2I, H]`` or ``[H, I]``)."""
        if self.kind == "expert_gate_up":
            return [torch.cat(Rule("gate_up", (), self.shape).unshard(shards))]
        if self.kind == "expert_down":
            return [torch.cat(list(shards), dim=1)]
        if self.kind == "replicated":
            return [shards[0]]
        if self.kind in ("rows", "cols"):
            return [torch.cat(list(shards), dim=0 if self.kind == "rows" else 1)]
        if self.kind == "vocab":
            return [torch.cat(list(shards))[: self.shape.vocab_size]]
        if self.kind == "gate_up":
            halves = [_split(s, 2, 0) for s in shards]
            return [torch.cat([h[0] for h in halves]), torch.cat([h[1] for h in halves])]
        return self._unshard_qkv(shards)

    def _group_rows(self) -> tuple[int, int]:
        """``(query rows per group, rows per fused group)``."""
        s = self.shape
        q_rows = s.num_heads // s.num_kv_heads * s.head_dim
        return q_rows, q_rows + 2 * s.head_dim

    def _shard_qkv(self, hf: Sequence[torch.Tensor], tp: int, rank: int) -> torch.Tensor:
        groups = self.shape.num_kv_heads
        if groups % tp:
            raise ValueError(f"{groups} key/value heads cannot be split over {tp} tensor-parallel ranks")
        q, k, v = hf
        q_rows, _ = self._group_rows()
        d = self.shape.head_dim
        per_rank = groups // tp
        parts = []
        for g in range(rank * per_rank, (rank + 1) * per_rank):
            parts += [q[g * q_rows : (g + 1) * q_rows], k[g * d : (g + 1) * d], v[g * d : (g + 1) * d]]
        return torch.cat(parts).clone()

    def _unshard_qkv(self, shards: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        q_rows, group_rows = self._group_rows()
        d = self.shape.head_dim
        fused = torch.cat(list(shards))
        blocks = _split(fused, fused.shape[0] // group_rows, 0)
        q = torch.cat([b[:q_rows] for b in blocks])
        k = torch.cat([b[q_rows : q_rows + d] for b in blocks])
        v = torch.cat([b[q_rows + d :] for b in blocks])
        return [q, k, v]


def stage_layers(num_layers: int, pp: int, stage: int) -> range:
    """Global indices of the decoder layers on pipeline stage ``stage`` (an equal share each)."""
    if num_layers % pp:
        raise ValueError(f"{num_layers} layers cannot be split evenly over {pp} pipeline stages")
    per_stage = num_layers // pp
    return range(stage * per_stage, (stage + 1) * per_stage)


def _moe_rules(shape: LlamaShape, mlp: str, local: str, experts: range) -> dict[str, Rule]:
    """The MoE block's rules: router, the ``experts`` (global indices) held here, the shared expert."""
    rules = {f"{local}.mlp.router.weight": Rule("replicated", (f"{mlp}.gate.weight",), shape)}
    for e in experts:
        name = f"{local}.mlp.experts.local_experts.{e % shape.local_experts}"
        rules[f"{name}.linear_fc1.weight"] = Rule("expert_gate_up", (f"{mlp}.experts.gate_up_proj",), shape, e)
        rules[f"{name}.linear_fc2.weight"] = Rule("expert_down", (f"{mlp}.experts.down_proj",), shape, e)
    if shape.shared_expert:
        shared = f"{mlp}.shared_expert"
        rules[f"{local}.mlp.shared_experts.linear_fc1.weight"] = Rule(
            "gate_up", (f"{shared}.gate_proj.weight", f"{shared}.up_proj.weight"), shape)
        rules[f"{local}.mlp.shared_experts.linear_fc2.weight"] = Rule("cols", (f"{shared}.down_proj.weight",), shape)
        rules[f"{local}.mlp.shared_experts.gate_weight"] = Rule("replicated", (f"{mlp}.shared_expert_gate.weight",),
                                                                shape)
    return rules


def _layer_rules(shape: LlamaShape, hf: str, local: str, experts: range) -> dict[str, Rule]:
    """One decoder layer's rules; ``experts``: the MoE experts (global indices) to map."""
    attn, mlp = f"{hf}.self_attn", f"{hf}.mlp"
    rules = {
        f"{local}.input_layernorm.weight": Rule("replicated", (f"{hf}.input_layernorm.weight",), shape),
        f"{local}.self_attention.linear_qkv.weight": Rule(
            "qkv", tuple(f"{attn}.{p}_proj.weight" for p in "qkv"), shape),
        f"{local}.self_attention.linear_proj.weight": Rule("cols", (f"{attn}.o_proj.weight",), shape),
        f"{local}.pre_mlp_layernorm.weight": Rule("replicated", (f"{hf}.post_attention_layernorm.weight",), shape),
    }
    if shape.num_experts:
        rules.update(_moe_rules(shape, mlp, local, experts))
    else:
        rules[f"{local}.mlp.linear_fc1.weight"] = Rule("gate_up", (f"{mlp}.gate_proj.weight", f"{mlp}.up_proj.weight"),
                                                       shape)
        rules[f"{local}.mlp.linear_fc2.weight"] = Rule("cols", (f"{mlp}.down_proj.weight",), shape)
    if shape.qkv_bias:
        rules[f"{local}.self_attention.linear_qkv.bias"] = Rule("qkv", tuple(f"{attn}.{p}_proj.bias" for p in "qkv"),
                                                                shape)
    if shape.qk_norm:
        for part in "qk":
            rules[f"{local}.self_attention.{part}_layernorm.weight"] = Rule("replicated", (f"{attn}.{part}_norm.weight",),
                                                                            shape)
    return rules


def stage_rules(shape: LlamaShape, pp: int, stage: int, prefix: str = "model.", lm_head: bool = True,
                ep_rank: int = 0) -> dict[str, Rule]:
    """Megatron parameter name -> :class:`Rule` for every parameter of pipeline stage ``stage``.

    Args:
        prefix: the HF prefix of the decoder (``"model."`` in a causal LM, ``"backbone."`` for rlvr's
            critic, whose backbone is the HF base model).
        lm_head: the model has an LM head (False for the critic: a value head replaces it).
        ep_rank: the expert-parallel rank whose experts to map.
    """
    rules: dict[str, Rule] = {}
    first, last = stage == 0, stage == pp - 1
    experts = range(ep_rank * shape.local_experts, (ep_rank + 1) * shape.local_experts)
    if first:
        rules["embedding.word_embeddings.weight"] = Rule("vocab", (f"{prefix}embed_tokens.weight",), shape)
    for local, layer in enumerate(stage_layers(shape.num_layers, pp, stage)):
        rules.update(_layer_rules(shape, f"{prefix}layers.{layer}", f"decoder.layers.{local}", experts))
    if last:
        rules["decoder.final_layernorm.weight"] = Rule("replicated", (f"{prefix}norm.weight",), shape)
        if lm_head and not (shape.tied and first):
            source = f"{prefix}embed_tokens.weight" if shape.tied else "lm_head.weight"
            rules["output_layer.weight"] = Rule("vocab", (source,), shape)
    return rules


def all_stage_rules(shape: LlamaShape, pp: int, prefix: str = "model.", lm_head: bool = True
                    ) -> list[tuple[int, str, Rule]]:
    """``(stage, megatron name, rule)`` of every stage in a fixed order (the same on every rank), each
    HF tensor once: a tied head's copy on the last stage is left out (the embedding gives it); every
    expert of an MoE model, under its name on its own expert-parallel rank (:attr:`Rule.owner`), the
    experts of rank ``r`` after those of rank ``r - 1``."""
    out = []
    for stage in range(pp):
        for ep_rank in range(shape.ep):
            for name, rule in stage_rules(shape, pp, stage, prefix, lm_head, ep_rank).items():
                if not (name == "output_layer.weight" and shape.tied) and (ep_rank == 0 or rule.expert is not None):
                    out.append((stage, name, rule))
    return out


def shard_state(hf_state: Mapping[str, torch.Tensor], rules: Mapping[str, Rule], tp: int, rank: int,
                etp: int = 1, etp_rank: int = 0) -> dict[str, torch.Tensor]:
    """This rank's megatron tensors from an HF state dict (``rules``: :func:`stage_rules`); expert
    rules are cut over the ``etp`` expert-tensor-parallel ranks.

    Raises:
        KeyError: an HF tensor the rules need is missing from ``hf_state``.
    """
    missing = sorted({n for rule in rules.values() for n in rule.hf_names} - set(hf_state))
    if missing:
        raise KeyError(f"the Hugging Face state has no {missing[:4]}{' ...' if len(missing) > 4 else ''}")
    return {name: rule.shard([hf_state[n] for n in rule.hf_names], *((etp, etp_rank) if rule.expert is not None
                                                                     else (tp, rank)))
            for name, rule in rules.items()}
