"""The router tap: replaying a forward pass's own routes changes nothing (bit for bit, fp32 and bf16,
values and gradients), replayed routes reach the experts with the router's own weights, ``-1`` keeps a
token's own choice."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model

from rlvr.utils.testing import tiny_causal_lm
from rlvr.utils.tiny_moe import TINY_MOE_ARCHS, tiny_moe_lm
from rlvr.workers.moe.routers import RouterTap, replayed_weights, router_tap


def _inputs(rows: int = 3, width: int = 7, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    mask = torch.ones(rows, width, dtype=torch.long)
    mask[0, :2] = 0  # left padding
    return {"input_ids": torch.randint(4, 260, (rows, width), generator=gen), "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("arch", TINY_MOE_ARCHS)
def test_replaying_the_own_routes_is_the_same_forward(arch, dtype):
    model = tiny_moe_lm(arch, dtype=dtype)
    tap = router_tap(model)
    assert tap.shape.layers == 2 and tap.shape.num_experts == 8 and tap.shape.top_k == 2
    batch = _inputs()
    tap.arm()
    plain = model(**batch).logits
    plain.float().square().sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    routes = tap.routes()
    assert routes.shape == (3 * 7, 2, 2)
    model.zero_grad()
    tap.arm(replay=routes)
    replayed = model(**batch).logits
    replayed.float().square().sum().backward()
    tap.disarm()
    assert torch.equal(plain, replayed)
    assert all(torch.equal(grads[n], p.grad) for n, p in model.named_parameters())


def test_replayed_routes_reach_the_experts_with_the_routers_weights():
    model = tiny_moe_lm("qwen3_moe")
    tap = router_tap(model)
    seen = {}
    model.model.layers[1].mlp.experts.register_forward_hook(
        lambda module, args, out: seen.update(index=args[1].clone(), weights=args[2].clone()))
    batch = _inputs()
    tokens = 3 * 7
    tap.arm(keep_logits=True)
    with torch.no_grad():
        model(**batch)
    own = tap.routes()
    given = torch.full((tokens, 2, 2), -1, dtype=torch.long)
    given[:5, 1] = torch.tensor([6, 3])  # the first 5 tokens of layer 1 go to experts 6 and 3
    tap.arm(replay=given, keep_logits=True)
    with torch.no_grad():
        model(**batch)
    logits = tap.logits[1]
    assert seen["index"][:5].tolist() == [[6, 3]] * 5
    assert torch.equal(seen["index"][5:], tap.selected[1][5:])  # -1: the router's own choice
    probs = logits.softmax(-1)
    expected = probs[:5, [6, 3]] / probs[:5, [6, 3]].sum(-1, keepdim=True)  # Qwen3-MoE renormalises
    torch.testing.assert_close(seen["weights"][:5], expected, rtol=1e-6, atol=0)
    assert torch.equal(tap.routes()[:, 0], own[:, 0])  # layer 0 kept its routes, so layer 1's inputs are the same
    tap.disarm()


def test_mixtral_renormalises_and_keeps_float32_weights():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]], dtype=torch.bfloat16)
    weights = replayed_weights(logits, torch.tensor([[3, 0]]), True, torch.float32)
    p = torch.tensor([0.0, 1.0, 2.0, 3.0]).softmax(-1)
    assert weights.dtype == torch.float32
    torch.testing.assert_close(weights, (p[[3, 0]] / p[[3, 0]].sum())[None])
    unnormalised = replayed_weights(logits, torch.tensor([[3, 0]]), False, torch.bfloat16)
    torch.testing.assert_close(unnormalised.float(), p[[3, 0]][None].bfloat16().float())


def test_a_wrong_number_of_routes_is_refused():
    model = tiny_moe_lm("mixtral")
    tap = router_tap(model)
    tap.arm(replay=torch.zeros(5, 2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="routes 21 tokens but routes for 5 tokens were given"):
        model(**_inputs())
    with pytest.raises(ValueError, match=r"\[\*, 2, 2\] expected"):
        tap.arm(replay=torch.zeros(21, 3, 2, dtype=torch.long))
    tap.disarm()


def test_one_tap_per_model_and_none_for_a_dense_one():
    model = tiny_moe_lm("olmoe")
    tap = router_tap(model)
    assert isinstance(tap, RouterTap) and router_tap(model) is tap
    assert tap.aux_loss_coef == 0.0  # the config did not ask for the load-balancing loss
    peft_model = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"]))
    assert router_tap(peft_model) is tap
    dense, _ = tiny_causal_lm()
    assert router_tap(dense) is None
    assert router_tap(torch.nn.Linear(2, 2)) is None


def test_the_tap_takes_over_the_load_balancing_loss_of_the_config():
    model = tiny_moe_lm("mixtral", output_router_logits=True, router_aux_loss_coef=0.02)
    tap = router_tap(model)
    assert tap.aux_loss_coef == 0.02
    assert model.config.output_router_logits is False  # transformers' own no longer runs in every forward
    assert model(**_inputs()).aux_loss is None
