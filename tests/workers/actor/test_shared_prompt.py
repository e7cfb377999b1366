"""Running each distinct prompt once gives the plain forward's hidden states, log-probs and
gradients, and a policy update with it equals the update without it."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model

from rlvr.protocol import DataProto
from rlvr.trainer.config.loader import load_config
from rlvr.utils.testing import tiny_causal_lm
from rlvr.workers.actor.dp_actor import DataParallelPPOActor, response_hidden
from rlvr.workers.actor.shared_prompt import shared_prompt_hidden
from rlvr.workers.batching import distinct_prompts, prompt_grouped_order

PAD = 0


def make_batch(response_lens: list[int], prompt_of_row: list[int], response_len: int = 5, seed: int = 0):
    """Rows with left-padded prompts (3 distinct prompts of lengths 6, 3 and 4, chosen per row by
    ``prompt_of_row``) and right-padded responses of ``response_lens`` tokens."""
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(4, 200, (n,), generator=gen) for n in (6, 3, 4)]
    width = 6
    rows = len(prompt_of_row)
    input_ids = torch.full((rows, width + response_len), PAD)
    attention_mask = torch.zeros(rows, width + response_len, dtype=torch.long)
    responses = torch.full((rows, response_len), PAD)
    for row, (which, n) in enumerate(zip(prompt_of_row, response_lens)):
        prompt = prompts[which]
        input_ids[row, width - len(prompt) : width] = prompt
        attention_mask[row, width - len(prompt) : width] = 1
        responses[row, :n] = torch.randint(4, 200, (n,), generator=gen)
        attention_mask[row, width : width + n] = 1
    input_ids[:, width:] = responses
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    response_mask = attention_mask[:, width:].clone()
    return {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids,
            "responses": responses, "response_mask": response_mask}


def hidden_and_grads(model, batch, share: bool):
    model.zero_grad()
    hidden, _ = response_hidden(model, batch, share_prompts=share)
    grad_out = torch.randn(hidden.shape, generator=torch.Generator().manual_seed(1), dtype=hidden.dtype)
    (hidden * grad_out * batch["response_mask"][:, : hidden.shape[1], None]).sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return hidden.detach(), grads


def test_distinct_prompts_ignores_padding_ids_and_numbers_prompts_by_first_row():
    ids = torch.tensor([[0, 5, 6], [0, 7, 8], [9, 5, 6], [1, 5, 6], [0, 7, 8]])
    mask = torch.tensor([[0, 1, 1], [0, 1, 1], [0, 1, 1], [0, 1, 1], [0, 1, 1]])
    first, inverse = distinct_prompts(ids, mask)
    assert first.tolist() == [0, 1]  # rows 0, 2, 3 differ only in a padding id
    assert inverse.tolist() == [0, 1, 0, 0, 1]
    assert prompt_grouped_order(ids, mask) == [0, 2, 3, 1, 4]
    mask[3, 0] = 1  # now the id 1 is a real token: a third prompt
    first, inverse = distinct_prompts(ids, mask)
    assert first.tolist() == [0, 1, 3] and inverse.tolist() == [0, 1, 0, 2, 1]


def assert_grads_close(actual: dict, expected: dict, tol: float) -> None:
    """Gradients equal to ``tol`` relative to each tensor's largest entry. Llama's RMSNorm computes
    in float32 even in a float64 model, and the shared forward adds the n rows' gradients before
    that float32 backward instead of after it, so float64 models agree to ~1e-7, not 1e-15."""
    assert set(actual) == set(expected) and len(expected) >= 8
    for name, grad in expected.items():
        scale = float(grad.abs().max())
        torch.testing.assert_close(actual[name], grad, rtol=tol, atol=tol * scale, msg=name)


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-6), (torch.float32, 2e-5)])
def test_hidden_states_and_gradients_equal_the_plain_forward(dtype, tol):
    model, _ = tiny_causal_lm(dtype=dtype, seed=3)
    model.train()
    batch = make_batch(response_lens=[5, 2, 4, 1, 5, 3], prompt_of_row=[0, 1, 0, 2, 1, 0])
    plain_hidden, plain_grads = hidden_and_grads(model, batch, share=False)
    shared_hidden, shared_grads = hidden_and_grads(model, batch, share=True)
    assert shared_hidden.shape == plain_hidden.shape == (6, 5, 32)
    mask = batch["response_mask"][..., None].bool()
    torch.testing.assert_close(shared_hidden * mask, plain_hidden * mask, rtol=tol, atol=tol)
    assert_grads_close(shared_grads, plain_grads, tol)


def test_one_response_column_and_all_distinct_prompts():
    model, _ = tiny_causal_lm(dtype=torch.float64)
    one_column = make_batch(response_lens=[1, 1, 1], prompt_of_row=[0, 0, 1], response_len=1)
    hidden = shared_prompt_hidden(model, one_column["input_ids"], one_column["attention_mask"],
                                  one_column["position_ids"], prompt_len=6, num_response=1)
    plain, _ = response_hidden(model, one_column)
    torch.testing.assert_close(hidden, plain, rtol=1e-10, atol=1e-10)
    distinct = make_batch(response_lens=[2, 3, 1], prompt_of_row=[0, 1, 2])
    assert shared_prompt_hidden(model, distinct["input_ids"], distinct["attention_mask"],
                                distinct["position_ids"], prompt_len=6, num_response=3) is None


def test_gradient_checkpointing_falls_back_to_the_plain_forward():
    model, _ = tiny_causal_lm()
    getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)()
    model.train()
    batch = make_batch(response_lens=[3, 3], prompt_of_row=[0, 0])
    assert shared_prompt_hidden(model, batch["input_ids"], batch["attention_mask"], batch["position_ids"],
                                prompt_len=6, num_response=5) is None
    hidden, _ = response_hidden(model, batch, share_prompts=True)
    assert hidden.shape == (2, 3, 32)


def test_lora_model_gradients_match():
    base, _ = tiny_causal_lm(dtype=torch.float64, seed=5)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                            init_lora_weights=False))
    model.train()
    batch = make_batch(response_lens=[4, 2, 5, 3], prompt_of_row=[2, 2, 0, 2])
    plain_hidden, plain_grads = hidden_and_grads(model, batch, share=False)
    shared_hidden, shared_grads = hidden_and_grads(model, batch, share=True)
    assert any("lora" in name for name in plain_grads)
    mask = batch["response_mask"][..., None].bool()
    torch.testing.assert_close(shared_hidden * mask, plain_hidden * mask, rtol=1e-10, atol=1e-10)
    assert_grads_close(shared_grads, plain_grads, 1e-6)


def _actor(share: bool, micro: int):
    cfg = load_config("grpo", ["actor_rollout_ref.actor.use_kl_loss=false",
                               f"actor_rollout_ref.actor.share_prompt_forward={share}",
                               f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}"])
    model, _ = tiny_causal_lm(dtype=torch.float64, seed=7)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # the update is linear in the gradient
    actor = DataParallelPPOActor(cfg.actor_rollout_ref.actor, model, optimizer, mini_batch_size=8,
                                 log_prob_micro_batch_size=3, world_size=1, device="cpu")
    return actor, model


def test_policy_update_and_log_probs_equal_with_and_without_sharing():
    batch = make_batch(response_lens=[5, 2, 4, 1, 5, 3, 2, 4], prompt_of_row=[0, 1, 0, 2, 1, 0, 2, 1])
    gen = torch.Generator().manual_seed(2)
    batch["advantages"] = torch.randn(8, 5, generator=gen, dtype=torch.float64) * batch["response_mask"]
    batch["old_log_probs"] = -torch.rand(8, 5, generator=gen, dtype=torch.float64) * 3
    data = DataProto.from_dict(tensors=batch, meta_info={"temperature": 0.7})
    results = []
    for share in (False, True):
        actor, model = _actor(share, micro=3)
        assert actor.share_prompts is share
        log_probs, _ = actor.compute_log_prob(data)
        metrics = actor.update_policy(data)
        results.append((log_probs, metrics, [p.detach().clone() for p in model.parameters()]))
    (lp_plain, m_plain, w_plain), (lp_shared, m_shared, w_shared) = results
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(lp_shared[mask], lp_plain[mask], rtol=1e-6, atol=1e-6)
    assert m_shared["actor/grad_norm"][0] == pytest.approx(m_plain["actor/grad_norm"][0], rel=1e-6)
    assert m_shared["actor/pg_loss"][0] == pytest.approx(m_plain["actor/pg_loss"][0], rel=1e-6, abs=1e-9)
    assert any(not torch.equal(a, b) for a, b in zip(w_plain, _actor(False, 3)[1].parameters()))
    for a, b in zip(w_shared, w_plain):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_count_micro_batches_are_cut_from_rows_grouped_by_prompt():
    batch = make_batch(response_lens=[2] * 6, prompt_of_row=[0, 1, 0, 1, 0, 1])
    actor, _ = _actor(True, micro=3)
    assert actor._micro_batches(batch, 3, False, 0) == [[0, 2, 4], [1, 3, 5]]
    plain, _ = _actor(False, micro=3)
    assert plain._micro_batches(batch, 3, False, 0) == [[0, 1, 2], [3, 4, 5]]



def test_gradients_are_bit_identical_from_run_to_run_with_two_threads():
    """With the cache rows selected by advanced indexing (``keys[rows]``), the backward was an
    ``index_put_`` with accumulate, whose two threads add into one prompt's cache row in a varying
    order: gradients differed in the last bits between runs (5 of 5 repeats here) and a seeded
    training run drifted from its second step. The caches (16 rows x 4 heads x 90 positions x 16)
    are large enough for PyTorch to split that backward over two threads."""
    model, _ = tiny_causal_lm(hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
                              intermediate_size=128, seed=11)
    model.train()
    gen = torch.Generator().manual_seed(4)
    prompts = torch.randint(4, 200, (2, 90), generator=gen)
    input_ids = torch.cat([prompts.repeat_interleave(torch.tensor([5, 11]), dim=0),
                           torch.randint(4, 200, (16, 6), generator=gen)], dim=1)
    attention_mask = torch.ones_like(input_ids)
    position_ids = torch.arange(96).expand(16, 96)
    grad_out = torch.randn(16, 6, 64, generator=gen)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        runs = []
        for _ in range(6):
            model.zero_grad()
            hidden = shared_prompt_hidden(model, input_ids, attention_mask, position_ids, prompt_len=90,
                                          num_response=6)
            (hidden * grad_out).sum().backward()
            runs.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    finally:
        torch.set_num_threads(threads)
    assert hidden.shape == (16, 6, 64) and len(runs[0]) >= 8
    for run in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(run, runs[0]))
