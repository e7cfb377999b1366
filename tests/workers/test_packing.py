"""Sequence packing (use_remove_padding): the packed forward equals the padded one (fp32, 1e-5) on
log-probs, entropies, values, losses and gradients, for tiny Llama and Qwen2 models, batches whose
prompt and response lengths vary from 1 to 20 tokens."""

from __future__ import annotations

import pytest
import torch
from packed_batches import actor_config, make_actor, make_critic, random_batch, tiny_model

from rlvr.protocol import DataProto
from rlvr.workers.packed_attention import segment_sdpa, use_packed_attention, varlen_kernel_attention
from rlvr.workers.packing import pack_batch
from rlvr.workers.ulysses import SequenceParallel

TOL = 1e-5
ARCHS = ["llama", "qwen2"]


def _max_diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    return float((a - b)[mask.bool()].abs().max())


def test_pack_batch_layout_by_hand():
    # row 0: prompt [_, 11, 12], response [13, 14, _]; row 1: prompt [21, 22, 23], response [24, _, _]
    ids = torch.tensor([[0, 11, 12, 13, 14, 0], [21, 22, 23, 24, 0, 0]])
    mask = torch.tensor([[0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0]])
    pos = torch.tensor([[0, 0, 1, 2, 3, 3], [0, 1, 2, 3, 3, 3]])
    packed = pack_batch(ids, mask, pos, response_len=3, pad_to_multiple_of=3)
    assert packed.input_ids.tolist() == [[11, 12, 13, 14, 21, 22, 23, 24, 0]]  # 8 tokens + 1 padding
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 0, 1, 2, 3, 0]]
    assert packed.cu_seqlens.tolist() == [0, 4, 8, 9] and packed.cu_seqlens.dtype == torch.int32
    assert packed.max_seqlen == 4
    # 13 is predicted at packed position 1 (token 12), 14 at 2, 24 at 6 (token 23)
    assert packed.response_positions.tolist() == [1, 2, 6]
    assert packed.response_index.tolist() == [0, 1, 3]  # [b * R] cells (0, 0), (0, 1), (1, 0)
    assert packed.labels.tolist() == [13, 14, 24]
    out = packed.unpack(torch.tensor([1.0, 2.0, 3.0]), SequenceParallel())
    assert out.tolist() == [[1.0, 2.0, 0.0], [3.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match="no real token"):
        pack_batch(ids, torch.tensor([[0, 1, 1, 1, 1, 0], [0, 0, 0, 0, 0, 0]]), pos, response_len=3)
    with pytest.raises(ValueError, match="row 1 has padding between real tokens"):  # a right-padded prompt
        pack_batch(ids, torch.tensor([[0, 1, 1, 1, 1, 0], [1, 1, 0, 1, 0, 0]]), pos, response_len=3)


@pytest.mark.parametrize("window", [None, 3])
def test_segment_sdpa_attends_within_each_sequence(window):
    gen = torch.Generator().manual_seed(0)
    lengths = [1, 5, 7]
    q, k, v = (torch.randn(1, heads, 13, 8, generator=gen) for heads in (4, 2, 2))
    cu = torch.tensor([0, 1, 6, 13], dtype=torch.int32)
    out = segment_sdpa(q, k, v, cu, scaling=0.3, sliding_window=window)
    start = 0
    for length in lengths:  # reference: explicit softmax over the allowed keys of each sequence
        qs, ks, vs = q[0, :, start : start + length], k[0, :, start : start + length], v[0, :, start : start + length]
        ks, vs = ks.repeat_interleave(2, 0), vs.repeat_interleave(2, 0)
        i = torch.arange(length)
        allowed = (i[:, None] >= i[None, :]) & ((i[:, None] - i[None, :] < window) if window else True)
        scores = (qs @ ks.transpose(1, 2) * 0.3).masked_fill(~allowed, float("-inf"))
        expected = (scores.softmax(-1) @ vs).transpose(0, 1)
        torch.testing.assert_close(out[0, start : start + length], expected, atol=1e-6, rtol=1e-5)
        start += length


def _fake_varlen(gqa_argument: bool):
    """A stand-in for ``varlen_attn`` on CPU (``[T, heads, d]`` in and out, through segment_sdpa):
    with the ``enable_gqa`` argument (torch 2.13) or without it (torch 2.11: equal heads only)."""
    calls = []

    def run(q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, window_size=(-1, -1)):
        assert window_size[1] == 0 and torch.equal(cu_q, cu_k) and max_q == max_k
        calls.append(k.shape[1])
        if k.shape[1] != q.shape[1]:
            raise AssertionError("grouped key/value heads reached a kernel that cannot take them")
        window = None if window_size[0] < 0 else window_size[0] + 1
        return segment_sdpa(*(t.transpose(0, 1)[None] for t in (q, k, v)), cu_q, scale, sliding_window=window)[0]

    def run_gqa(q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, window_size=(-1, -1), enable_gqa=False):
        assert enable_gqa == (k.shape[1] != q.shape[1])
        calls.append(k.shape[1])
        window = None if window_size[0] < 0 else window_size[0] + 1
        return segment_sdpa(*(t.transpose(0, 1)[None] for t in (q, k, v)), cu_q, scale, sliding_window=window)[0]

    return (run_gqa if gqa_argument else run), calls


@pytest.mark.parametrize("gqa_argument", [True, False])
@pytest.mark.parametrize("window", [None, 3])
def test_varlen_kernel_attention_handles_kernels_without_enable_gqa(gqa_argument, window):
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, heads, 13, 8, generator=gen) for heads in (6, 2, 2))
    cu = torch.tensor([0, 4, 6, 13], dtype=torch.int32)
    kernel, calls = _fake_varlen(gqa_argument)
    out = varlen_kernel_attention(kernel, q, k, v, cu, 7, 0.3, window)
    expected = segment_sdpa(q, k, v, cu, scaling=0.3, sliding_window=window)
    assert out.shape == (1, 13, 6, 8)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)
    assert calls == [2 if gqa_argument else 6]  # key/value heads the kernel saw


def test_varlen_kernel_attention_rejects_uneven_head_groups():
    q, k = torch.zeros(1, 5, 4, 8), torch.zeros(1, 2, 4, 8)
    with pytest.raises(ValueError, match="5 query heads are not a multiple of 2 key/value heads"):
        varlen_kernel_attention(_fake_varlen(False)[0], q, k, k, torch.tensor([0, 4], dtype=torch.int32), 4, None, None)


def _grads(actor) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in actor.module.named_parameters()}


def _forward_and_backward(actor, batch: dict, entropy_grad: bool):
    actor.module.zero_grad(set_to_none=True)
    log_probs, entropy = actor._forward(batch, 0.7, True, entropy_grad=entropy_grad)
    loss = -(log_probs * batch["advantages"]).sum() - (0.1 * entropy * batch["response_mask"]).sum() * entropy_grad
    loss.backward()
    return log_probs.detach(), entropy.detach(), _grads(actor)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("entropy_grad", [False, True], ids=["chunked_head", "logits_head"])
def test_packed_actor_log_probs_entropy_and_gradients_equal_padded(arch, entropy_grad):
    batch = random_batch(rows=6, seed=1)
    padded = make_actor(tiny_model(arch))
    packed = make_actor(tiny_model(arch), packed=True)
    assert packed.chunked_head and not packed.share_prompts
    lp_a, ent_a, grads_a = _forward_and_backward(padded, batch, entropy_grad)
    lp_b, ent_b, grads_b = _forward_and_backward(packed, batch, entropy_grad)
    mask = batch["response_mask"]
    assert _max_diff(lp_a, lp_b, mask) < TOL and _max_diff(ent_a, ent_b, mask) < TOL
    assert float(lp_b[~mask.bool()].abs().max()) == 0.0  # no response token: zero
    for name, grad in grads_a.items():
        torch.testing.assert_close(grads_b[name], grad, atol=TOL, rtol=1e-4, msg=name)


@pytest.mark.parametrize("arch", ARCHS)
def test_packed_actor_update_equals_padded_with_token_budgets(arch):
    batch = random_batch(rows=8, seed=2)
    config = actor_config("entropy_coeff=0.01", "use_dynamic_bsz=true", "ppo_max_token_len_per_gpu=64")
    padded = make_actor(tiny_model(arch), lr=0.5, mini_batch_size=8, config=actor_config("entropy_coeff=0.01"))
    packed = make_actor(tiny_model(arch), packed=True, lr=0.5, mini_batch_size=8, config=config,
                        log_prob_use_dynamic_bsz=True, log_prob_max_token_len=48)
    data = DataProto.from_dict(tensors=batch, meta_info={"temperature": 1.0})
    old_a, _ = padded.compute_log_prob(data)
    old_b, _ = packed.compute_log_prob(data)
    assert _max_diff(old_a, old_b, batch["response_mask"]) < TOL
    data.batch["old_log_probs"] = old_a - 0.1 * batch["response_mask"]
    one, two = padded.update_policy(data), packed.update_policy(data)
    for name in ("actor/pg_loss", "actor/ppo_kl", "actor/entropy", "actor/grad_norm"):
        assert two[name] == pytest.approx(one[name], rel=1e-5, abs=TOL), name
    for (name, p_a), p_b in zip(padded.module.named_parameters(), packed.module.parameters()):
        torch.testing.assert_close(p_b, p_a, atol=TOL, rtol=1e-5, msg=name)


def test_packed_forward_with_gradient_checkpointing_equals_padded():
    """The recompute in the backward (outside the packed call) attends within the sequences too."""
    batch = random_batch(rows=5, seed=3)
    padded = make_actor(tiny_model("llama"))
    packed = make_actor(tiny_model("llama", checkpointing=True), packed=True)
    padded.module.train()
    packed.module.train()
    lp_a, _, grads_a = _forward_and_backward(padded, batch, True)
    lp_b, _, grads_b = _forward_and_backward(packed, batch, True)
    assert _max_diff(lp_a, lp_b, batch["response_mask"]) < TOL
    for name, grad in grads_a.items():
        torch.testing.assert_close(grads_b[name], grad, atol=TOL, rtol=1e-4, msg=name)


@pytest.mark.parametrize("arch", ARCHS)
def test_packed_critic_values_loss_and_gradients_equal_padded(arch):
    batch = random_batch(rows=6, seed=4)
    padded = make_critic(arch, lr=0.5)
    packed = make_critic(arch, 1, True, 1, 0.5, 6, "use_dynamic_bsz=true", "ppo_max_token_len_per_gpu=40")
    data = DataProto.from_dict(tensors=batch)
    values_a, values_b = padded.compute_values(data), packed.compute_values(data)
    assert _max_diff(values_a, values_b, batch["response_mask"]) < TOL
    data.batch["values"] = values_a
    data.batch["returns"] = values_a + batch["advantages"]
    one, two = padded.update_critic(data), packed.update_critic(data)
    for name in ("critic/vf_loss", "critic/grad_norm"):
        assert two[name] == pytest.approx(one[name], rel=1e-5, abs=TOL), name
    for (name, p_a), p_b in zip(padded.module.named_parameters(), packed.module.parameters()):
        torch.testing.assert_close(p_b, p_a, atol=TOL, rtol=1e-5, msg=name)


def test_padded_calls_on_a_packed_model_are_unchanged():
    """The rollout shares the actor's module: generation and padded forwards go to the model's own
    attention (and masks) after the switch."""
    batch = random_batch(rows=4, seed=5)
    model = tiny_model("llama")
    prompt = {"input_ids": batch["input_ids"][:, :20], "attention_mask": batch["attention_mask"][:, :20]}
    before = model.generate(**prompt, max_new_tokens=6, do_sample=False)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    use_packed_attention(model)
    assert model.config._attn_implementation == "rlvr_packed_sdpa"
    assert torch.equal(model.generate(**prompt, max_new_tokens=6, do_sample=False), before)
    again = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    assert torch.equal(again, logits)
