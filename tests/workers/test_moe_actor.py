"""The actor on a mixture-of-experts policy: routes laid out and back, routing replay (R3: the same
forward when the routes are the actor's own, the given experts otherwise; R2: routes recorded in
compute_log_prob and replayed in the update), the load-balancing loss in the policy loss against
transformers' own, and the expert-load entropy."""

from __future__ import annotations

import pytest
import torch
from packed_batches import actor_config, make_actor, random_batch

from rlvr.protocol import DataProto
from rlvr.utils.tiny_moe import tiny_moe_lm
from rlvr.workers.actor.dp_actor import response_window
from rlvr.workers.moe.balance import expert_counts, load_entropy
from rlvr.workers.moe.layout import ROUTED_EXPERTS, TokenLayout
from rlvr.workers.packing import pack_batch
from rlvr.workers.ulysses import sequence_parallel_group

ROWS = 6


def _data(seed: int = 3) -> DataProto:
    batch = random_batch(rows=ROWS, seed=seed)
    return DataProto.from_dict(tensors=batch, meta_info={"temperature": 1.0})


def _actor(mode: str, packed: bool = False, lr: float = 0.0, checkpointing: bool = False, **model_kwargs):
    model = tiny_moe_lm("qwen3_moe", **model_kwargs)
    if checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    config = actor_config("ppo_micro_batch_size_per_gpu=3", "grad_clip=1e9")
    actor = make_actor(model, packed=packed, lr=lr, mini_batch_size=ROWS, config=config, router_replay=mode)
    actor.log_prob_micro_batch_size = 3
    return actor


def test_routes_go_to_the_forward_order_and_back():
    batch = random_batch(rows=4, seed=1)
    mask = batch["attention_mask"]
    routes = torch.randint(0, 8, (*mask.shape, 2, 2), dtype=torch.int16).masked_fill(~mask.bool()[..., None, None], -1)
    start, stop, _ = response_window(batch)
    sp = sequence_parallel_group(1, 1)
    padded = TokenLayout.padded(mask, start, stop)
    tokens = padded.tokens(routes)
    assert tokens.shape == (4 * (stop - start), 2, 2)
    assert torch.equal(padded.token_mask(), mask[:, start:stop].flatten().bool())
    assert torch.equal(padded.place(tokens, sp), routes)
    packed = TokenLayout.packed(mask, pack_batch(batch["input_ids"], mask, batch["position_ids"], 20), sp)
    tokens = packed.tokens(routes)
    assert tokens.shape == (int(mask.sum()), 2, 2) and bool((tokens >= 0).all())
    assert torch.equal(tokens, routes.long()[mask.bool()])
    assert torch.equal(packed.place(tokens, sp), routes)


@pytest.mark.parametrize("packed", [False, True])
def test_r3_replays_the_given_routes_and_its_own_change_nothing(packed):
    data = _data()
    recorder = _actor("R2", packed)
    plain, _, own = recorder.compute_log_prob_and_routes(data)
    mask = data.batch["attention_mask"].bool()
    assert bool((own[mask] >= 0).all()) and bool((own[~mask] == -1).all())
    replaying = _actor("R3", packed)
    data.batch[ROUTED_EXPERTS] = own
    assert torch.equal(replaying.compute_log_prob(data)[0], plain)
    # other routes: the forward sends the tokens there and the log-probs move
    other = torch.where(own >= 0, (own + 3) % 8, own)
    other[..., 1] = torch.where(own[..., 1] >= 0, (own[..., 0] + 4) % 8, -1)  # two distinct experts
    data.batch[ROUTED_EXPERTS] = other
    moved, _, _ = replaying.compute_log_prob_and_routes(data)
    response = data.batch["response_mask"].bool()
    assert float((moved - plain)[response].abs().max()) > 1e-3
    with pytest.raises(ValueError, match="router_replay.mode=R3 replays the batch's routed_experts"):
        replaying.compute_log_prob(_data())


def test_r2_update_with_the_recorded_routes_equals_the_update_without_replay():
    data = _data()
    weights = {}
    for mode in ("disabled", "R2"):
        actor = _actor(mode, lr=0.5, checkpointing=True)  # the backward's recomputation replays too
        log_probs, _, routes = actor.compute_log_prob_and_routes(data)
        batch = data.select()
        batch.batch["old_log_probs"] = log_probs - 0.1
        if routes is not None:
            batch.batch[ROUTED_EXPERTS] = routes
        actor.update_policy(batch)
        weights[mode] = {n: p.detach().clone() for n, p in actor.module.named_parameters()}
    assert all(torch.equal(weights["R2"][n], weights["disabled"][n]) for n in weights["R2"])
    actor = _actor("R2", lr=0.5)
    data = _data()
    data.batch["old_log_probs"] = torch.zeros_like(data.batch["response_mask"], dtype=torch.float32)
    with pytest.raises(ValueError, match="R2 records them in compute_log_prob"):
        actor.update_policy(data)


def _hf_aux_and_entropy(model, batch: dict) -> tuple[torch.Tensor, list[float]]:
    """transformers' own load-balancing loss of the actor's forward window, and the load entropy of
    its routers' top-2 (from the returned router logits)."""
    start, stop, _ = response_window(batch)
    window = {key: batch[key][:, start:stop] for key in ("input_ids", "attention_mask", "position_ids")}
    out = model(**window, output_router_logits=True)
    real = window["attention_mask"].flatten().bool()
    picks = [logits.softmax(-1).topk(2, dim=-1).indices for logits in out.router_logits]
    return out.aux_loss, load_entropy(expert_counts(picks, real, 8)).tolist()


def test_the_load_balancing_loss_joins_the_policy_loss_with_the_configs_coefficient():
    data = _data()
    data.batch["old_log_probs"] = torch.zeros(ROWS, 20)
    lr, coef = 0.5, 0.3
    steps = {}
    for name, kwargs in (("off", {}), ("on", dict(output_router_logits=True, router_aux_loss_coef=coef))):
        actor = _actor("disabled", lr=lr, **kwargs)
        actor.config.ppo_micro_batch_size_per_gpu = ROWS  # one micro-batch: the loss of the whole window
        before = {n: p.detach().clone() for n, p in actor.module.named_parameters()}
        metrics = actor.update_policy(data)
        steps[name] = {n: p.detach() - before[n] for n, p in actor.module.named_parameters()}
        steps[name + "_metrics"] = metrics
    model = tiny_moe_lm("qwen3_moe")
    model.train()
    aux, entropy = _hf_aux_and_entropy(model, data.batch)
    aux.backward()
    for name, param in model.named_parameters():
        expected = -lr * coef * param.grad if param.grad is not None else torch.zeros_like(param)
        torch.testing.assert_close(steps["on"][name] - steps["off"][name], expected, rtol=1e-4, atol=1e-6)
    for name in ("off", "on"):
        metrics = steps[name + "_metrics"]
        assert metrics["actor/moe_aux_loss"] == [pytest.approx(float(aux), rel=1e-5)]
        assert [metrics[f"actor/moe_load_entropy/layer_{i}"][0] for i in range(2)] == pytest.approx(entropy, rel=1e-6)
