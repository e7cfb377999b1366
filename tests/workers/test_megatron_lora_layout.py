"""The plain-torch half of Megatron LoRA (rlvr.workers.megatron.lora_spec / lora_layout; no
megatron-core): which layers the targets pick, a rank's adapter tensors as slices of the full ones,
and the per-shard merge ``W_t + (alpha / r) B_t A`` against the merge of the full HF weights."""

from __future__ import annotations

import pytest
import torch

from rlvr.workers.megatron.hf_mapping import LlamaShape, Rule
from rlvr.workers.megatron.lora_layout import full_adapter, merge_shard_adapters, shard_delta, shard_part, unshard_part
from rlvr.workers.megatron.lora_spec import CANONICAL_TARGETS, LoraSpec, layer_sites

SHAPE = LlamaShape(num_layers=2, num_heads=4, num_kv_heads=2, head_dim=3, vocab_size=10, padded_vocab=10, tied=False,
                   qkv_bias=False)
HIDDEN, FFN = 12, 8
HF = {"linear_qkv": ("q_proj", "k_proj", "v_proj"), "linear_fc1": ("gate_proj", "up_proj"),
      "linear_proj": ("o_proj",), "linear_fc2": ("down_proj",)}
WEIGHT_RULE = {"linear_qkv": "qkv", "linear_fc1": "gate_up", "linear_proj": "cols", "linear_fc2": "cols"}


def test_targets_pick_layers_by_name_glob_and_exclusion():
    sites = layer_sites(LoraSpec(rank=2, alpha=4), layer=3, local=1)
    assert [(s.module, s.path, s.parts) for s in sites] == [
        ("linear_qkv", "decoder.layers.1.self_attention.linear_qkv", ("fused",)),
        ("linear_proj", "decoder.layers.1.self_attention.linear_proj", ("fused",)),
        ("linear_fc1", "decoder.layers.1.mlp.linear_fc1", ("fused",)),
        ("linear_fc2", "decoder.layers.1.mlp.linear_fc2", ("fused",))]
    only_first = LoraSpec(rank=2, alpha=4, targets=("*.layers.0.*.linear_qkv",))
    assert [s.module for s in layer_sites(only_first, 0, 0)] == ["linear_qkv"] and not layer_sites(only_first, 1, 0)
    canonical = LoraSpec(rank=2, alpha=4, kind="canonical_lora", targets=("linear_q", "linear_v", "linear_fc1_up"))
    assert [(s.module, s.parts) for s in layer_sites(canonical, 0, 0)] == [("linear_qkv", ("q", "v")),
                                                                         ("linear_fc1", ("up",))]
    excluded = LoraSpec(rank=2, alpha=4, kind="canonical_lora", targets=(), excludes=("linear_k", "linear_fc2"))
    assert [(s.module, s.parts) for s in layer_sites(excluded, 0, 0)] == [
        ("linear_qkv", ("q", "v")), ("linear_proj", ("fused",)), ("linear_fc1", ("gate", "up"))]
    assert LoraSpec(rank=2, alpha=4, kind="canonical_lora", targets=CANONICAL_TARGETS).problems() == []


def _weights(module: str, gen: torch.Generator) -> list[torch.Tensor]:
    q, kv, h = SHAPE.num_heads * SHAPE.head_dim, SHAPE.num_kv_heads * SHAPE.head_dim, HIDDEN
    shapes = {"linear_qkv": [(q, h), (kv, h), (kv, h)], "linear_fc1": [(FFN, h), (FFN, h)],
              "linear_proj": [(h, q)], "linear_fc2": [(h, FFN)]}[module]
    return [torch.randn(s, generator=gen) for s in shapes]


@pytest.mark.parametrize("kind", ["lora", "canonical_lora"])
@pytest.mark.parametrize("module", ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"])
def test_shard_merges_gather_to_the_merged_hf_weights(kind, module):
    spec = LoraSpec(rank=2, alpha=6, kind=kind, b_init="normal", seed=3)
    parts = {"lora": ("fused",), "canonical_lora": {"linear_qkv": ("q", "k", "v"), "linear_fc1": ("gate", "up")}
             .get(module, ("fused",))}[kind]
    full = {part: full_adapter(spec, SHAPE, HIDDEN, FFN, 1, module, part) for part in parts}
    hf = _weights(module, torch.Generator().manual_seed(0))
    # the reference: each HF weight plus scale * (its rows of B) @ A
    want = []
    for i, weight in enumerate(hf):
        part = parts[i] if len(parts) > 1 else "fused"
        a, b = full[part]
        rows = torch.split(b, [w.shape[0] for w in hf]) if len(parts) == 1 and len(hf) > 1 else [b] * len(hf)
        want.append(weight + spec.scale * rows[i if len(parts) == 1 else 0] @ a)
    rule, tp = Rule(WEIGHT_RULE[module], (), SHAPE), 2
    merged = []
    for rank in range(tp):
        mine = {part: shard_part(SHAPE, module, part, *full[part], tp, rank) for part in parts}
        merged.append(rule.shard(hf, tp, rank) + shard_delta(SHAPE, tp, module, mine, spec.scale))
        prefix = f"gpt.decoder.layers.1.x.{module}"
        state = {f"{prefix}.weight": rule.shard(hf, tp, rank), **{f"{prefix}.adapter.{w}_{p}": t for p, ab in mine.items()
                                                                  for w, t in zip("AB", ab)}}
        assert torch.equal(merge_shard_adapters(state, SHAPE, tp, spec.scale)[f"{prefix}.weight"], merged[-1])
        assert list(merge_shard_adapters(state, SHAPE, tp, spec.scale)) == [f"{prefix}.weight"]
    for got, expected in zip(rule.unshard(merged), want):
        assert torch.allclose(got, expected, atol=1e-6)
    for part in parts:  # a rank's tensors are slices of the full adapters
        shards = [shard_part(SHAPE, module, part, *full[part], tp, rank) for rank in range(tp)]
        a, b = unshard_part(SHAPE, module, part, [s[0] for s in shards], [s[1] for s in shards])
        assert torch.equal(a, full[part][0]) and torch.equal(b, full[part][1])
