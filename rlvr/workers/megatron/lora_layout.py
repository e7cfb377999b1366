"""Where LoRA adapters sit on a Megatron decoder and how their tensors are cut over tensor-parallel ranks.

Pure torch (no megatron import, no collective), so that :mod:`rlvr.model_merger` can merge adapters
of a checkpoint without megatron-core. LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large
Language Models") adds ``scale * B @ A`` (``A [r, in]``, ``B [out, r]``, ``scale = alpha / r``) to a
linear layer's weight; the layers are megatron's names (verl's ``model.lora.target_modules``):

- ``linear_qkv`` (column parallel: ``q_proj``/``k_proj``/``v_proj`` fused per query group) and
  ``linear_fc1`` (column parallel: ``gate_proj``/``up_proj``): ``A`` replicated over the
  tensor-parallel ranks, ``B``'s rows cut like the weight's rows;
- ``linear_proj`` (``o_proj``) and ``linear_fc2`` (``down_proj``), row parallel: ``A``'s columns cut
  like the weight's columns, ``B`` replicated.

``type=lora`` puts one adapter on each fused layer (one ``A`` for q, k and v; ``B``'s rows in the HF
order ``[q; k; v]`` or ``[gate; up]``, cut by the same :class:`~rlvr.workers.megatron.hf_mapping.Rule`
as the weight). ``type=canonical_lora`` puts one adapter on each of q, k, v (``linear_q``,
``linear_k``, ``linear_v``) and gate, up (``linear_fc1_gate``, ``linear_fc1_up``), as peft places
them on the HF model; their outputs are interleaved into the fused layout (:func:`fuse`).

The full (unsharded) adapters are drawn from a generator seeded by the run's seed and the layer's
name, so every layout starts from the same full adapters and a rank's tensors are slices of them.
"""

from __future__ import annotations

import math
import zlib

import torch

from rlvr.workers.megatron.hf_mapping import LlamaShape, Rule, _split
from rlvr.workers.megatron.lora_spec import ROW_PARALLEL, LoraSpec

__all__ = ["part_shapes", "full_adapter", "shard_part", "unshard_part", "fuse", "shard_delta", "init_tensor",
           "merge_shard_adapters"]


def part_shapes(shape: LlamaShape, hidden: int, ffn: int, module: str, part: str) -> tuple[int, int]:
    """``(out, in)`` of the full HF weight a part adapts (a fused part: the HF weights stacked)."""
    q, kv = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    rows = {("linear_qkv", "fused"): q + 2 * kv, ("linear_qkv", "q"): q, ("linear_qkv", "k"): kv,
            ("linear_qkv", "v"): kv, ("linear_fc1", "fused"): 2 * ffn, ("linear_fc1", "gate"): ffn,
            ("linear_fc1", "up"): ffn, ("linear_proj", "fused"): hidden, ("linear_fc2", "fused"): hidden}
    cols = {"linear_qkv": hidden, "linear_fc1": hidden, "linear_proj": q, "linear_fc2": ffn}
    return rows[(module, part)], cols[module]


def init_tensor(method: str, shape: tuple[int, int], generator: torch.Generator) -> torch.Tensor:
    """A float32 ``shape`` tensor initialised by ``method`` (:data:`INIT_METHODS`)."""
    tensor = torch.empty(shape)
    if method == "xavier":
        return torch.nn.init.xavier_normal_(tensor, generator=generator)
    if method == "kaiming":
        return torch.nn.init.kaiming_uniform_(tensor, a=math.sqrt(5), generator=generator)
    if method == "normal":
        return torch.nn.init.normal_(tensor, 0.0, 0.2, generator=generator)
    return tensor.zero_()


def full_adapter(spec: LoraSpec, shape: LlamaShape, hidden: int, ffn: int, layer: int, module: str, part: str
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """The full float32 ``(A [r, in], B [out, r])`` of one part of global layer ``layer``, the same in
    every layout (drawn from a generator seeded by ``spec.seed`` and the part's name)."""
    out, inp = part_shapes(shape, hidden, ffn, module, part)
    name = f"{layer}.{module}.{part}"
    generator = torch.Generator().manual_seed((spec.seed * 1_000_003 + zlib.crc32(name.encode())) % 2**63)
    return (init_tensor(spec.a_init, (spec.rank, inp), generator),
            init_tensor(spec.b_init, (out, spec.rank), generator))


def _fused_rule(shape: LlamaShape, module: str) -> Rule:
    return Rule("qkv" if module == "linear_qkv" else "gate_up", (), shape)


def _hf_rows(shape: LlamaShape, module: str, tensor: torch.Tensor) -> list[torch.Tensor]:
    """A fused part's ``[q; k; v]`` (or ``[gate; up]``) rows as the HF tensors."""
    if module == "linear_fc1":
        return _split(tensor, 2, 0)
    q, kv = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    return list(torch.split(tensor, [q, kv, kv]))


def shard_part(shape: LlamaShape, module: str, part: str, a: torch.Tensor, b: torch.Tensor, tp: int, rank: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s ``(A, B)`` of a full part: a column layer's ``A`` whole and ``B``'s rows cut like the
    weight's rows (a fused ``B`` by the weight's own rule); a row layer's ``A`` columns cut, ``B`` whole."""
    if module in ROW_PARALLEL:
        return _split(a, tp, 1)[rank].clone(), b.clone()
    if part == "fused":
        return a.clone(), _fused_rule(shape, module).shard(_hf_rows(shape, module, b), tp, rank)
    return a.clone(), _split(b, tp, 0)[rank].clone()


def unshard_part(shape: LlamaShape, module: str, part: str, a_shards: list[torch.Tensor],
                 b_shards: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The full ``(A, B)`` of a part from every tensor-parallel rank's (inverse of :func:`shard_part`)."""
    if module in ROW_PARALLEL:
        return torch.cat(a_shards, dim=1), b_shards[0]
    if part == "fused":
        return a_shards[0], torch.cat(_fused_rule(shape, module).unshard(b_shards))
    return a_shards[0], torch.cat(b_shards)


def fuse(shape: LlamaShape, tp: int, module: str, parts: dict[str, torch.Tensor]) -> torch.Tensor:
    """A column layer's rank-local output rows ``[..., out / tp]`` from its parts' rows (last dim): a
    fused part as it is; canonical q/k/v interleaved per query group, gate/up one after the other,
    a part without adapter as zeros."""
    if "fused" in parts:
        return parts["fused"]
    ref = next(iter(parts.values()))
    lead = ref.shape[:-1]
    if module == "linear_fc1":
        width = ref.shape[-1]
        return torch.cat([parts.get(p, ref.new_zeros((*lead, width))) for p in ("gate", "up")], dim=-1)
    groups, d = shape.num_kv_heads // tp, shape.head_dim
    widths = {"q": shape.num_heads // shape.num_kv_heads * d, "k": d, "v": d}
    per_group = [parts[p].reshape(*lead, groups, widths[p]) if p in parts else ref.new_zeros((*lead, groups, widths[p]))
                 for p in ("q", "k", "v")]
    return torch.cat(per_group, dim=-1).reshape(*lead, -1)


def shard_delta(shape: LlamaShape, tp: int, module: str, adapters: dict[str, tuple[torch.Tensor, torch.Tensor]],
                scale: float) -> torch.Tensor:
    """``scale * B @ A`` of one rank's adapters, float32, shaped like the rank's weight shard
    (``[out / tp, in]`` column, ``[out, in / tp]`` row); ``adapters``: part -> ``(A, B)``."""
    deltas = {part: b.float() @ a.float() for part, (a, b) in adapters.items()}
    if module in ROW_PARALLEL:
        return scale * deltas["fused"]
    return scale * fuse(shape, tp, module, {p: t.T for p, t in deltas.items()}).T


def merge_shard_adapters(params: dict[str, torch.Tensor], shape: LlamaShape, tp: int, scale: float
                         ) -> dict[str, torch.Tensor]:
    """A checkpoint shard's parameters (``gpt.*`` names of one tensor-parallel rank) with every adapter
    (``<layer>.adapter.A_<part>`` / ``B_<part>``) merged into its layer's weight and dropped: the
    weight shards of the merged model (``shape``: cut over ``tp`` ranks; ``scale``: ``alpha / r``)."""
    out, adapters = {}, {}
    for name, tensor in params.items():
        layer, sep, param = name.partition(".adapter.")
        if sep:
            which, part = param.split("_", 1)
            adapters.setdefault(layer, {}).setdefault(part, {})[which] = tensor
        else:
            out[name] = tensor
    for layer, parts in adapters.items():
        weight = out[f"{layer}.weight"]
        pairs = {part: (ab["A"], ab["B"]) for part, ab in parts.items()}
        delta = shard_delta(shape, tp, layer.rpartition(".")[2], pairs, scale)
        out[f"{layer}.weight"] = (weight.float() + delta).to(weight.dtype)
    return out
