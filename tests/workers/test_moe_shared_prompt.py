"""The shared-prompt forward of a mixture-of-experts actor equals its plain forward: log-probs,
entropies, gradients, the load-balancing loss, the expert load and the recorded routes, without
routing replay and under R2 and R3 (fp32, to 1e-5); a micro-batch whose rows of one prompt carry
different prompt routes runs the plain forward and is counted; a whole update is the same."""

from __future__ import annotations

import pytest
import torch
from packed_batches import actor_config, make_actor

from rlvr.protocol import DataProto
from rlvr.utils.tiny_moe import tiny_moe_lm
from rlvr.workers.actor.dp_actor import response_window
from rlvr.workers.moe.balance import expert_counts, load_balancing_loss
from rlvr.workers.moe.layout import ROUTED_EXPERTS, SharedPromptLayout, TokenLayout
from rlvr.workers.moe.routers import MoeShape, RoutingTap
from rlvr.workers.ulysses import sequence_parallel_group

PROMPT_OF_ROW = [0, 0, 0, 1, 1, 1, 2, 2]  # grouped by prompt, as a GRPO batch (rollout.n rows each)
RESPONSE_LENS = [6, 2, 4, 1, 5, 3, 6, 2]
ROWS, WIDTH, RESPONSE = len(PROMPT_OF_ROW), 8, 6
TOL = 1e-5


def grpo_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    """Three distinct left-padded prompts (7, 3 and 5 tokens) with their rows' right-padded responses."""
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(4, 260, (n,), generator=gen) for n in (7, 3, 5)]
    input_ids = torch.zeros(ROWS, WIDTH + RESPONSE, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for row, (which, n) in enumerate(zip(PROMPT_OF_ROW, RESPONSE_LENS, strict=True)):
        prompt = prompts[which]
        input_ids[row, WIDTH - len(prompt) : WIDTH] = prompt
        input_ids[row, WIDTH : WIDTH + n] = torch.randint(4, 260, (n,), generator=gen)
        mask[row, WIDTH - len(prompt) : WIDTH + n] = 1
    response_mask = mask[:, WIDTH:].clone()
    return {"input_ids": input_ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            "responses": input_ids[:, WIDTH:].clone(), "response_mask": response_mask,
            "advantages": torch.randn(ROWS, RESPONSE, generator=gen) * response_mask,
            "old_log_probs": -torch.rand(ROWS, RESPONSE, generator=gen) * 4}


def rollout_routes(batch: dict, seed: int = 1, layers: int = 2) -> torch.Tensor:
    """Routes as the HF engine records them: each prompt's tokens the same experts in all its rows
    (random, two distinct of 8), each response token its own, -1 on padding."""
    gen = torch.Generator().manual_seed(seed)
    shape = (ROWS, WIDTH + RESPONSE, layers)
    first = torch.randint(0, 8, shape, generator=gen)
    second = (first + torch.randint(1, 8, shape, generator=gen)) % 8
    routes = torch.stack([first, second], dim=-1)
    for row, which in enumerate(PROMPT_OF_ROW):
        routes[row, :WIDTH] = routes[PROMPT_OF_ROW.index(which), :WIDTH]
    return routes.masked_fill(~batch["attention_mask"].bool()[..., None, None], -1).to(torch.int16)


def moe_actor(arch: str, mode: str, share: bool, lr: float = 0.0):
    """An actor over a tiny ``arch`` MoE with the load-balancing loss on (coefficient 0.3), micro-batches of 4."""
    model = tiny_moe_lm(arch, output_router_logits=True, router_aux_loss_coef=0.3)
    config = actor_config("ppo_micro_batch_size_per_gpu=4", "grad_clip=1e9", f"share_prompt_forward={share}")
    return make_actor(model, lr=lr, mini_batch_size=ROWS, config=config, router_replay=mode)


def layouts_seen(actor, monkeypatch) -> list[type]:
    """The layout type of every micro-batch the actor's routers are armed for, from now on."""
    seen, start = [], actor.routing.start
    monkeypatch.setattr(actor.routing, "start", lambda batch, layout: (seen.append(type(layout)), start(batch, layout)))
    return seen


def micro_loss_and_grads(actor, micro: dict) -> tuple[torch.Tensor, dict, dict]:
    """One update micro-batch's loss and metrics (policy loss + 0.3 x load-balancing loss), its
    gradients, and the expert-load metrics it counted."""
    actor.module.train()
    actor.module.zero_grad()
    actor._set_routing(actor.routing.update_step())
    try:
        loss, metrics = actor._micro_loss(micro, 1.0)
        loss.backward()
    finally:
        actor._set_routing(None)
    grads = {name: p.grad.clone() for name, p in actor.module.named_parameters() if p.grad is not None}
    return metrics, grads, actor.routing.load_metrics(torch.device("cpu"))


def assert_grads_close(actual: dict, expected: dict) -> None:
    """Equal to ``TOL`` relative to each tensor's largest entry."""
    assert set(actual) == set(expected) and len(expected) >= 10
    for name, grad in expected.items():
        torch.testing.assert_close(actual[name], grad, rtol=TOL, atol=TOL * float(grad.abs().max()), msg=name)


@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral"])
@pytest.mark.parametrize("mode", ["disabled", "R2", "R3"])
def test_shared_prompts_equal_the_plain_forward(arch, mode, monkeypatch):
    batch = grpo_batch()
    if mode == "R3":
        batch[ROUTED_EXPERTS] = rollout_routes(batch)
    data = DataProto.from_dict(tensors=batch, meta_info={"temperature": 1.0})
    results = {}
    for share in (False, True):
        actor = moe_actor(arch, mode, share)
        assert actor.share_prompts is share
        seen = layouts_seen(actor, monkeypatch)
        stats = actor.compute_log_prob_stats(data, calculate_entropy=True)
        assert seen == [SharedPromptLayout if share else TokenLayout] * 2  # two micro-batches of 4
        micro = {key: value[:4] for key, value in batch.items()}  # prompts 0, 0, 0, 1
        if mode == "R2":
            micro[ROUTED_EXPERTS] = stats[ROUTED_EXPERTS][:4]
        results[share] = (stats, *micro_loss_and_grads(actor, micro))
        assert seen[-1] is (SharedPromptLayout if share else TokenLayout)
    (plain, plain_metrics, plain_grads, plain_load), (shared, metrics, grads, load) = results[False], results[True]
    response = batch["response_mask"].bool()
    for name in ("log_probs", "entropy"):
        torch.testing.assert_close(shared[name][response], plain[name][response], rtol=TOL, atol=TOL)
    if mode == "R2":  # the recorded routes: per row, the prompt's in each of its rows
        assert torch.equal(shared[ROUTED_EXPERTS], plain[ROUTED_EXPERTS])
        assert bool((shared[ROUTED_EXPERTS][batch["attention_mask"].bool()] >= 0).all())
    else:
        assert ROUTED_EXPERTS not in shared
    # pg_loss, ..., actor/moe_aux_loss: the load-balancing loss of the micro-batch
    torch.testing.assert_close(metrics, plain_metrics, rtol=TOL, atol=TOL)
    assert float(metrics[-1]) > 0.5
    assert_grads_close(grads, plain_grads)
    assert load == pytest.approx(plain_load, rel=1e-9)
    assert load["actor/moe_shared_prompt_fallback"] == 0.0


def test_rows_with_other_prompt_routes_run_the_plain_forward_and_are_counted(monkeypatch):
    batch = grpo_batch()
    routes = rollout_routes(batch)
    routes[5, WIDTH - 1, 1] = torch.tensor([7, 6]) if routes[5, WIDTH - 1, 1, 0] != 7 else torch.tensor([5, 6])
    batch[ROUTED_EXPERTS] = routes  # row 5's last prompt token: other experts than rows 3 and 4 of its prompt
    data = DataProto.from_dict(tensors=batch, meta_info={"temperature": 1.0})
    plain = moe_actor("mixtral", "R3", share=False)
    actor = moe_actor("mixtral", "R3", share=True)
    seen = layouts_seen(actor, monkeypatch)
    log_probs, _ = actor.compute_log_prob(data)
    assert seen == [SharedPromptLayout, TokenLayout]  # rows 0-3 share; rows 4-7 hold rows 4 and 5 of prompt 1
    expected, _ = plain.compute_log_prob(data)
    response = batch["response_mask"].bool()
    torch.testing.assert_close(log_probs[response], expected[response], rtol=TOL, atol=TOL)
    # row 5 went to its own experts: its log-probs differ from replaying row 3's prompt routes
    batch[ROUTED_EXPERTS] = rollout_routes(batch)
    consistent, _ = plain.compute_log_prob(DataProto.from_dict(tensors=batch, meta_info={"temperature": 1.0}))
    assert float((consistent[5] - expected[5])[response[5]].abs().max()) > 1e-4
    assert actor.routing.load_metrics(torch.device("cpu"))["actor/moe_shared_prompt_fallback"] == 1.0
    metrics = actor.update_policy(data)
    assert metrics["actor/moe_shared_prompt_fallback"] == [1.0]
    assert plain.update_policy(data)["actor/moe_shared_prompt_fallback"] == [0.0]


@pytest.mark.parametrize("mode", ["disabled", "R2", "R3"])
def test_a_policy_update_with_shared_prompts_equals_the_plain_update(mode):
    batch = grpo_batch(seed=4)
    if mode == "R3":
        batch[ROUTED_EXPERTS] = rollout_routes(batch, seed=5)
    runs = {}
    for share in (False, True):
        actor = moe_actor("mixtral", mode, share, lr=0.5)
        data = DataProto.from_dict(tensors=dict(batch), meta_info={"temperature": 1.0})
        log_probs, _, routes = actor.compute_log_prob_and_routes(data)
        data.batch["old_log_probs"] = log_probs - 0.05
        if routes is not None:
            data.batch[ROUTED_EXPERTS] = routes
        metrics = actor.update_policy(data)
        runs[share] = metrics, {n: p.detach().clone() for n, p in actor.module.named_parameters()}
    (plain_metrics, plain_weights), (metrics, weights) = runs[False], runs[True]
    assert set(metrics) == set(plain_metrics)
    for name, values in plain_metrics.items():
        assert metrics[name] == pytest.approx(values, rel=TOL, abs=TOL), name
    start = dict(tiny_moe_lm("mixtral").named_parameters())
    assert max(float((w - start[n]).abs().max()) for n, w in plain_weights.items()) > 1e-3  # it moved
    for name, weight in plain_weights.items():
        torch.testing.assert_close(weights[name], weight, rtol=TOL, atol=TOL, msg=name)


def test_shared_prompt_layout_maps_routes_to_the_two_segments_and_back():
    batch = grpo_batch()
    mask = batch["attention_mask"]
    routes = rollout_routes(batch)
    start, stop, num_response = response_window(batch)
    prompt_stop = stop - num_response
    assert (start, prompt_stop, stop) == (1, WIDTH, WIDTH + RESPONSE)
    first, inverse = torch.tensor([0, 3, 6]), torch.tensor(PROMPT_OF_ROW)
    layout = SharedPromptLayout.padded(mask, start, prompt_stop, stop, first, inverse)
    prompt_tokens, response_tokens = 3 * (WIDTH - 1), ROWS * RESPONSE
    assert layout.segments == (prompt_tokens, response_tokens)
    tokens = layout.tokens(routes)
    assert torch.equal(tokens[:prompt_tokens].view(3, WIDTH - 1, 2, 2), routes[first, 1:WIDTH].long())
    assert torch.equal(tokens[prompt_tokens:].view(ROWS, RESPONSE, 2, 2), routes[:, WIDTH:].long())
    assert torch.equal(layout.place(tokens, sequence_parallel_group(1, 1)), routes)
    weights = layout.token_weights().view(-1)
    # prompt 0 (7 tokens, 3 rows), prompt 1 (3 tokens, 3 rows), prompt 2 (5 tokens, 2 rows); responses once
    assert weights[:prompt_tokens].view(3, WIDTH - 1).tolist() == [[3.0] * 7, [0.0] * 4 + [3.0] * 3,
                                                                   [0.0] * 2 + [2.0] * 5]
    assert torch.equal(weights[prompt_tokens:], mask[:, WIDTH:].flatten().float())
    assert float(weights.sum()) == float(mask[:, start:stop].sum())
    assert layout.prompt_routes_agree(routes)
    routes[2, 3] = torch.where(routes[2, 3] >= 0, (routes[2, 3] + 1) % 8, routes[2, 3])
    assert not layout.prompt_routes_agree(routes)
    routes[2, 0] = 5  # a padding column of that row (and one outside the window) is not compared
    routes[2, 3] = routes[0, 3]
    assert layout.prompt_routes_agree(routes)


def test_weighted_load_and_loss_equal_the_tokens_repeated():
    gen = torch.Generator().manual_seed(0)
    logits = [torch.randn(5, 4, generator=gen, requires_grad=True) for _ in range(2)]
    selected = [lg.detach().topk(2, dim=-1).indices for lg in logits]
    weights = torch.tensor([3.0, 0.0, 1.0, 2.0, 1.0])
    repeat = torch.tensor([0, 0, 0, 2, 3, 3, 4])  # token t written weights[t] times
    counts = expert_counts(selected, weights, 4)
    expected = torch.stack([torch.bincount(s[repeat].flatten(), minlength=4).double() for s in selected])
    assert torch.equal(counts, expected)
    loss = load_balancing_loss(logits, selected, weights, 4)
    reference = load_balancing_loss([lg[repeat] for lg in logits], [s[repeat] for s in selected],
                                    torch.ones(7, dtype=torch.bool), 4)
    torch.testing.assert_close(loss, reference, rtol=1e-6, atol=0)
    grads = torch.autograd.grad(loss, logits)
    reference_grads = torch.autograd.grad(reference, logits)
    for got, want in zip(grads, reference_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


def test_a_tap_replays_and_records_segment_by_segment():
    tap = RoutingTap(MoeShape(layers=2, num_experts=8, top_k=2), 0.0)
    replay = torch.arange(7 * 2 * 2).view(7, 2, 2) % 8
    tap.arm(replay, keep_logits=True, segments=(3, 4))
    assert torch.equal(tap.given(1, 3, torch.device("cpu")), replay[:3, 1])
    for layer in range(2):
        tap.record(layer, torch.full((3, 8), float(layer)), replay[:3, layer])
    assert tap.selected == [None, None]  # segment 1 has not run yet
    tap.enter_segment(1)
    assert torch.equal(tap.given(0, 4, torch.device("cpu")), replay[3:, 0])
    with pytest.raises(ValueError, match="routes 3 tokens but routes for 4 tokens"):
        tap.given(0, 3, torch.device("cpu"))
    for layer in range(2):
        tap.record(layer, torch.full((4, 8), 10.0 + layer), replay[3:, layer])
    assert torch.equal(tap.routes(), replay)
    assert tap.logits[1][:, 0].tolist() == [1.0] * 3 + [11.0] * 4
    with pytest.raises(ValueError, match="segment 2"):
        tap.enter_segment(2)
    with pytest.raises(ValueError, match="segments hold"):
        tap.arm(replay, segments=(3, 3))
    tap.arm(replay)  # one forward pass: the whole replay, and no segments to enter
    assert torch.equal(tap.given(0, 7, torch.device("cpu")), replay[:, 0])
    with pytest.raises(ValueError, match="segment 1"):
        tap.enter_segment(1)
