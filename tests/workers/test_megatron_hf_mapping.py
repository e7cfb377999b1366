"""The HF <-> Megatron weight mapping (pure torch, no megatron-core): layouts checked against
hand-built tensors, and HF -> shards -> HF bit-exact for every tensor/pipeline/expert split."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, Qwen2Config

from rlvr.utils.tiny_moe import tiny_moe_lm
from rlvr.workers.megatron.hf_mapping import LlamaShape, Rule, all_stage_rules, shard_state, stage_layers, stage_rules


def _shape(heads: int = 4, kv_heads: int = 2, head_dim: int = 1, vocab: int = 10, tied: bool = True,
           qkv_bias: bool = False, layers: int = 2, tp: int = 1) -> LlamaShape:
    return LlamaShape(num_layers=layers, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                      vocab_size=vocab, padded_vocab=-(-vocab // tp) * tp, tied=tied, qkv_bias=qkv_bias)


def _rows(n: int, offset: float) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float32)[:, None] + offset


def test_qkv_is_fused_per_query_group_and_split_by_groups():
    """4 query heads in 2 groups (head_dim 1): group g = its 2 query rows, its key row, its value row."""
    rule = Rule("qkv", ("q", "k", "v"), _shape())
    q, k, v = _rows(4, 0), _rows(2, 100), _rows(2, 200)
    whole = rule.shard([q, k, v], 1, 0).flatten().tolist()
    assert whole == [0, 1, 100, 200, 2, 3, 101, 201]
    assert rule.shard([q, k, v], 2, 0).flatten().tolist() == [0, 1, 100, 200]
    assert rule.shard([q, k, v], 2, 1).flatten().tolist() == [2, 3, 101, 201]
    with pytest.raises(ValueError, match="2 key/value heads cannot be split over 4"):
        rule.shard([q, k, v], 4, 0)


def test_gate_up_is_fused_per_rank():
    rule = Rule("gate_up", ("gate", "up"), _shape())
    gate, up = _rows(4, 0), _rows(4, 10)
    assert rule.shard([gate, up], 1, 0).flatten().tolist() == [0, 1, 2, 3, 10, 11, 12, 13]
    assert rule.shard([gate, up], 2, 0).flatten().tolist() == [0, 1, 10, 11]
    assert rule.shard([gate, up], 2, 1).flatten().tolist() == [2, 3, 12, 13]


def test_vocab_rows_are_padded_with_zeros_to_a_multiple_of_the_ranks():
    rule = Rule("vocab", ("embed",), _shape(vocab=5, tp=2))
    embed = _rows(5, 1)
    shards = [rule.shard([embed], 2, r) for r in range(2)]
    assert [s.flatten().tolist() for s in shards] == [[1, 2, 3], [4, 5, 0]]
    assert torch.equal(rule.unshard(shards)[0], embed)


def test_row_and_column_splits():
    weight = torch.arange(8.0).view(2, 4)
    assert Rule("cols", ("w",), _shape()).shard([weight], 2, 1).tolist() == [[2, 3], [6, 7]]
    assert Rule("rows", ("w",), _shape()).shard([weight], 2, 1).tolist() == [[4, 5, 6, 7]]
    assert Rule("replicated", ("w",), _shape()).shard([weight], 2, 1).tolist() == weight.tolist()


def test_stage_layers_and_stage_contents():
    assert list(stage_layers(4, 2, 1)) == [2, 3]
    with pytest.raises(ValueError, match="3 layers cannot be split evenly over 2"):
        stage_layers(3, 2, 0)
    shape = _shape(tied=True)
    one = stage_rules(shape, 1, 0)
    assert "output_layer.weight" not in one  # the head reuses the embedding on a single stage
    first, last = stage_rules(shape, 2, 0), stage_rules(shape, 2, 1)
    assert "embedding.word_embeddings.weight" in first and "decoder.final_layernorm.weight" not in first
    assert last["output_layer.weight"].hf_names == ("model.embed_tokens.weight",)  # the tied copy
    assert last["decoder.layers.0.input_layernorm.weight"].hf_names == ("model.layers.1.input_layernorm.weight",)
    untied = stage_rules(_shape(tied=False), 1, 0)
    assert untied["output_layer.weight"].hf_names == ("lm_head.weight",)


def _random_hf_state(config) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    return {name: p.detach().clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize(("tp", "pp"), [(1, 1), (2, 1), (1, 2), (2, 2)])
def test_hf_to_shards_to_hf_is_bit_exact(family, tp, pp):
    cls = LlamaConfig if family == "llama" else Qwen2Config
    tied = family == "llama"
    config = cls(vocab_size=37, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, tie_word_embeddings=tied)
    hf = _random_hf_state(config)
    shape = LlamaShape.from_hf_config(config, tp)
    assert shape.qkv_bias == (family == "qwen2") and shape.padded_vocab == (38 if tp == 2 else 37)
    shards = {(t, s): shard_state(hf, stage_rules(shape, pp, s), tp, t) for t in range(tp) for s in range(pp)}
    back: dict[str, torch.Tensor] = {}
    for stage, name, rule in all_stage_rules(shape, pp):
        pieces = [shards[(t, stage)][name] for t in range(tp)]
        back.update(zip(rule.hf_names, rule.unshard(pieces)))
    assert back.keys() == hf.keys()
    assert all(torch.equal(back[name], hf[name]) for name in hf)
    if tied and pp == 2:  # the last stage's head copy holds the embedding's rows
        assert torch.equal(shards[(0, 1)]["output_layer.weight"][: 37 // tp], hf["model.embed_tokens.weight"][: 37 // tp])


def test_a_missing_hf_tensor_is_named():
    shape = _shape()
    with pytest.raises(KeyError, match="model.embed_tokens.weight"):
        shard_state({}, stage_rules(shape, 1, 0), 1, 0)


@pytest.mark.parametrize("arch", ["qwen3_moe", "qwen2_moe", "mixtral"])
@pytest.mark.parametrize(("ep", "etp", "pp"), [(1, 1, 1), (2, 1, 1), (4, 2, 2)])
def test_moe_weights_round_trip_over_expert_ranks(arch, ep, etp, pp):
    """Every expert lands on its expert-parallel rank (cut over the expert-tensor ranks), and the
    shards of all ranks give the fused HF tensors back bit for bit."""
    model = tiny_moe_lm(arch)
    hf = model.state_dict()
    shape = LlamaShape.from_hf_config(model.config, 1, ep)
    assert shape.num_experts == 8 and shape.local_experts == 8 // ep
    shards = {(stage, e, x): shard_state(hf, stage_rules(shape, pp, stage, ep_rank=e), 1, 0, etp, x)
              for stage in range(pp) for e in range(ep) for x in range(etp)}
    first = stage_rules(shape, pp, 0, ep_rank=ep - 1)
    fc1 = first[f"decoder.layers.0.mlp.experts.local_experts.{8 // ep - 1}.linear_fc1.weight"]
    assert (fc1.expert, fc1.owner) == (7, ep - 1)  # the last expert, on the last expert rank
    gate_up = hf["model.layers.0.mlp.experts.gate_up_proj"][7]
    intermediate = gate_up.shape[0] // 2
    part = intermediate // etp
    assert torch.equal(shards[(0, ep - 1, 0)][f"decoder.layers.0.mlp.experts.local_experts.{8 // ep - 1}.linear_fc1.weight"],
                       torch.cat([gate_up[:part], gate_up[intermediate : intermediate + part]]))
    rebuilt: dict[str, list[torch.Tensor]] = {}
    for stage, name, rule in all_stage_rules(shape, pp):
        if rule.expert is None:
            tensors = rule.unshard([shards[(stage, 0, 0)][name]])  # tensor parallel size 1
            rebuilt.update({n: [t] for n, t in zip(rule.hf_names, tensors)})
        else:
            tensors = rule.unshard([shards[(stage, rule.owner, x)][name] for x in range(etp)])
            rebuilt.setdefault(rule.hf_names[0], []).append(tensors[0])
    assert {n for n in rebuilt} == {n for n in hf if n != "lm_head.weight"}
    for name, parts in rebuilt.items():
        assert torch.equal(torch.stack(parts) if len(parts) > 1 else parts[0], hf[name]), name
