"""FP8 rollout (``rollout.quantization=fp8``) on CPU, through the exact emulation of the fp8 product.

References are independent of the module under test: e4m3 rounding by nearest value in the table
of all 256 e4m3 codes (ties to the even code), dequantised float64 matrix products, and a plain
transformers forward of a copy of the model whose linear layers compute with the dequantised weights
and per-row quantised inputs.
"""

from __future__ import annotations

import copy

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from rlvr.trainer.config.schema import RolloutConfig
from rlvr.trainer.ppo.rollout_correction import (
    compute_rollout_correction_and_rejection_mask, compute_rollout_mismatch_metrics,
)
from rlvr.utils.testing import forward_log_probs, save_tiny_model, tiny_causal_lm
from rlvr.workers.rollout import HFRollout
from rlvr.workers.rollout.fp8 import E4M3, Fp8Linear, Fp8Weights, quantize_rows, rollout_fp8_weights
from tests.workers.model_worker_utils import prompt_batch, with_advantages

_CODES = torch.arange(256, dtype=torch.uint8)
_TABLE = _CODES.view(E4M3).double()  # every e4m3 value, two NaN codes among them


def reference_e4m3(x: torch.Tensor) -> torch.Tensor:
    """``x`` (already scaled into [-448, 448]) rounded to the nearest e4m3 value, ties to the even
    code, as float64: a lookup in the table of all codes."""
    distance = (x.double()[..., None] - _TABLE).abs()
    distance[..., _TABLE.isnan()] = float("inf")
    nearest = distance == distance.min(dim=-1, keepdim=True).values
    prefer_even = nearest.double() * (2.0 - (_CODES % 2).double())
    return _TABLE[prefer_even.argmax(dim=-1)]


def reference_fake_quant(x: torch.Tensor) -> torch.Tensor:
    """Per-row absmax e4m3 quantise-dequantise of ``[rows, cols]`` (float64)."""
    scale = x.double().abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / 448.0
    return reference_e4m3(x.double() / scale) * scale


def reference_fp8_model(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose linear layers (not the head) use the fake-quantised weight and
    quantise their input per row: the function the fp8 engine computes."""
    ref = copy.deepcopy(model)
    head = ref.get_output_embeddings()
    for module in ref.modules():
        if isinstance(module, nn.Linear) and module is not head:
            module.weight.data = reference_fake_quant(module.weight.data).float()
            module.register_forward_pre_hook(
                lambda _, args: (reference_fake_quant(args[0].reshape(-1, args[0].shape[-1]))
                                 .float().reshape(args[0].shape),))
    return ref


def test_quantize_rows_rounds_to_nearest_e4m3_with_one_scale_per_channel():
    torch.manual_seed(0)
    magnitudes = torch.logspace(-3, 2, 48)[:, None]
    weight = torch.randn(48, 64) * magnitudes
    weight[5] = 0.0  # an all-zero channel
    weight[7, 3] = 50.0 * magnitudes[7, 0]  # an outlier that sets its channel's scale
    q, scale = quantize_rows(weight)
    assert q.dtype == E4M3 and q.shape == (48, 64) and scale.shape == (48, 1) and scale.dtype == torch.float32
    amax = weight.abs().amax(dim=-1, keepdim=True)
    expected_scale = torch.where(amax > 0, amax, torch.tensor(1e-12)) / 448.0
    torch.testing.assert_close(scale, expected_scale, rtol=1e-6, atol=0.0)
    assert torch.equal(q.double(), reference_e4m3(weight.double() / scale.double()))
    # error bound per element: 2**-4 relative (3-bit mantissa), 2**-10 of the scale in the subnormal range
    dequantized = q.float() * scale
    bound = torch.maximum(weight.abs() * 2.0**-4, scale * 2.0**-10) * (1 + 1e-6)
    assert bool(((dequantized - weight).abs() <= bound).all())
    # the largest magnitude of every channel is represented exactly (448 * scale)
    torch.testing.assert_close(dequantized.abs().amax(dim=-1, keepdim=True), amax, rtol=1e-6, atol=0.0)
    assert torch.equal(dequantized[5], torch.zeros(64))
    # the error is real: a 3-bit mantissa is coarser than float32
    assert (dequantized - weight).abs().max() > 0


@pytest.mark.parametrize("bias", [False, True])
def test_fp8_linear_computes_with_the_dequantized_operands(bias):
    torch.manual_seed(1)
    linear = nn.Linear(64, 48, bias=bias)
    layer = Fp8Linear(linear, torch.device("cpu"), use_kernel=False)
    assert layer.weight.dtype == E4M3 and layer.bias is linear.bias  # the bias is shared, not copied
    x = torch.randn(3, 5, 64) * 3.0
    out = layer(x)
    expected = reference_fake_quant(x.reshape(-1, 64)) @ reference_fake_quant(linear.weight.detach()).t()
    if bias:
        expected = expected + linear.bias.detach().double()
    assert out.shape == (3, 5, 48) and out.dtype == torch.float32
    torch.testing.assert_close(out.reshape(-1, 48).double(), expected, rtol=1e-5, atol=1e-5)
    # not the full-precision layer's output: the fp8 rounding shows
    assert (out - linear(x)).abs().max() > 1e-3
    # bf16 activations: the same float32 result, rounded once to bf16
    out_bf16 = layer(x.to(torch.bfloat16))
    assert out_bf16.dtype == torch.bfloat16
    expected_bf16 = reference_fake_quant(x.to(torch.bfloat16).float().reshape(-1, 64)) @ \
        reference_fake_quant(linear.weight.detach()).t()
    if bias:
        expected_bf16 = (expected_bf16.float().to(torch.bfloat16) + linear.bias.detach().to(torch.bfloat16)).double()
    torch.testing.assert_close(out_bf16.reshape(-1, 48).double(), expected_bf16, rtol=1e-2, atol=1e-2)


def test_set_weight_requantizes_in_place():
    torch.manual_seed(2)
    linear = nn.Linear(32, 16, bias=False)
    layer = Fp8Linear(linear, torch.device("cpu"), use_kernel=False)
    pointers = (layer.weight.data_ptr(), layer.weight_scale.data_ptr())
    before = layer.dequantized_weight().clone()
    new = torch.randn(16, 32) * 5.0
    layer.set_weight(new)
    assert (layer.weight.data_ptr(), layer.weight_scale.data_ptr()) == pointers  # a captured graph stays valid
    q, scale = quantize_rows(new)
    assert torch.equal(layer.weight.view(torch.uint8), q.view(torch.uint8)) and torch.equal(layer.weight_scale, scale)
    assert torch.equal(layer.weight_widened, q.float())  # the emulation's exact float32 copy follows
    assert not torch.equal(layer.dequantized_weight(), before)
    with pytest.raises(ValueError, match=r"weight of shape \(16, 32\), got \(32, 16\)"):
        layer.set_weight(new.t())


def test_only_aligned_linear_layers_below_the_head_are_quantized():
    model, _ = tiny_causal_lm(hidden_size=32, intermediate_size=72)  # MLP width 72: not a multiple of 16
    fp8 = Fp8Weights(model, torch.device("cpu"), copy_structure=True)
    names = set(fp8.layers)
    assert {f"model.layers.{i}.self_attn.{p}_proj.weight" for i in range(2) for p in "qkvo"} == names
    assert isinstance(fp8.module.lm_head, nn.Linear)  # the head stays in full precision (tied to the embedding)
    assert isinstance(fp8.module.model.layers[0].mlp.gate_proj, nn.Linear)
    assert fp8.nbytes() == sum(layer.weight.numel() + 4 * layer.out_features for layer in fp8.layers.values())
    with pytest.raises(ValueError, match="is not supported by the hf engine; use fp8 or null"):
        rollout_fp8_weights("int4", model, torch.device("cpu"), owns_module=False)


def _fp8_engine(model, tokenizer, owns_module: bool = False) -> HFRollout:
    config = OmegaConf.merge(OmegaConf.structured(RolloutConfig),
                             {"response_length": 10, "prompt_length": 32, "quantization": "fp8"})
    return HFRollout(config, model, tokenizer, "cpu", seed=3, owns_module=owns_module)


def _masked(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return values[mask.bool()]


def test_engine_log_probs_are_those_of_the_fp8_model_and_the_actor_is_untouched():
    model, tokenizer = tiny_causal_lm(hidden_size=64, intermediate_size=128, seed=4)
    actor_weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    engine = _fp8_engine(model, tokenizer)
    # the actor's module keeps its full-precision layers; the engine's copy shares the other parameters
    assert all(type(m) is not Fp8Linear for m in model.modules())
    assert isinstance(engine.module.model.layers[0].self_attn.q_proj, Fp8Linear)
    assert engine.module.model.embed_tokens.weight is model.model.embed_tokens.weight
    assert engine.module.lm_head.weight is model.lm_head.weight

    out = engine.generate_sequences(prompt_batch(temperature=1.0))
    assert out.meta_info["rollout_log_probs_exact"] is False
    mask = out.batch["response_mask"]
    fp8_reference = forward_log_probs(reference_fp8_model(model), out.batch, 1.0)
    full_precision = forward_log_probs(model, out.batch, 1.0)
    rollout = out.batch["rollout_log_probs"]
    torch.testing.assert_close(_masked(rollout, mask), _masked(fp8_reference, mask), rtol=0, atol=2e-5)
    assert (_masked(rollout, mask) - _masked(full_precision, mask)).abs().max() > 1e-4  # the fp8 gap is real
    assert all(torch.equal(p, actor_weights[n]) for n, p in model.named_parameters())


def test_update_weights_requantizes_and_copies_the_rest():
    model, tokenizer = tiny_causal_lm(hidden_size=32, seed=6)
    engine = _fp8_engine(model, tokenizer, owns_module=True)  # the engine's own module (several ranks)
    assert engine.module is model and isinstance(model.model.layers[1].mlp.down_proj, Fp8Linear)
    before = engine.generate_sequences(prompt_batch(do_sample=False))
    torch.manual_seed(7)
    new_q = torch.randn(32, 32)
    new_norm = torch.rand(32) + 0.5
    engine.update_weights({"model.layers.0.self_attn.q_proj.weight": new_q, "model.norm.weight": new_norm}, 5)
    assert engine.weights_version == 5
    q, scale = quantize_rows(new_q)
    layer = model.model.layers[0].self_attn.q_proj
    assert torch.equal(layer.weight.view(torch.uint8), q.view(torch.uint8)) and torch.equal(layer.weight_scale, scale)
    assert torch.equal(model.model.norm.weight.detach(), new_norm)
    after = engine.generate_sequences(prompt_batch(do_sample=False))
    assert not torch.equal(after.batch["rollout_log_probs"], before.batch["rollout_log_probs"])
    with pytest.raises(KeyError, match="no parameter 'model.layers.0.self_attn.q_proj.bias'"):
        engine.update_weights({"model.layers.0.self_attn.q_proj.bias": torch.zeros(32)}, 6)


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    return str(save_tiny_model(tmp_path_factory.mktemp("fp8_model") / "model", hidden_size=64,
                               intermediate_size=128, seed=9))


def test_hybrid_worker_requantizes_at_sync_and_the_correction_sees_the_gap(tiny_model_dir):
    from rlvr.single_controller import ClassWithInitArgs, LocalResourcePool, LocalWorkerGroup
    from rlvr.workers.engine_workers import ActorRolloutRefWorker
    from tests.workers.model_worker_utils import make_config

    config = make_config(tiny_model_dir, "actor_rollout_ref.rollout.quantization=fp8",
                         "actor_rollout_ref.rollout.response_length=8", "actor_rollout_ref.actor.optim.lr=0.01")
    group = LocalWorkerGroup(LocalResourcePool(), ClassWithInitArgs(ActorRolloutRefWorker, config, "actor_rollout"))
    group.init_model()
    worker = group._workers[0]
    engine = worker.rollout
    layer_name = "model.layers.0.mlp.up_proj.weight"
    actor_weight = dict(worker.actor_module.named_parameters())[layer_name]

    out = group.generate_sequences(prompt_batch(temperature=1.0))
    old = group.compute_log_prob(out)
    assert old.meta_info["metrics"]["actor/reused_rollout_log_probs"] == [0.0]  # fp8 log-probs are not the actor's
    old_log_probs, rollout = old.batch["old_log_probs"], out.batch["rollout_log_probs"]
    mask = out.batch["response_mask"]
    gap = (old_log_probs - rollout).abs()[mask.bool()]
    assert gap.max() > 1e-4

    # the mismatch metrics and the rollout correction see exactly that gap
    metrics = compute_rollout_mismatch_metrics(old_log_probs, rollout, mask, threshold=0.1)
    assert metrics["training/rollout_log_probs_diff_max"] == pytest.approx(gap.max().item(), rel=1e-6)
    assert metrics["training/rollout_log_probs_diff_mean"] == pytest.approx(gap.mean().item(), rel=1e-5)
    weights, _, corr = compute_rollout_correction_and_rejection_mask(old_log_probs, rollout, mask, rollout_is="token",
                                                                     rollout_is_threshold=1.001)
    expected = torch.exp(old_log_probs - rollout).clamp(max=1.001) * mask
    torch.testing.assert_close(weights, expected, rtol=1e-6, atol=1e-7)
    assert 0 < corr["rollout_corr/rollout_is_ratio_fraction_high"] < 1
    assert corr["rollout_corr/rollout_is_mean"] != 1.0

    # an actor update, then the sync: the fp8 layer is re-quantised from the new weights
    before = engine.fp8.layers[layer_name].weight.view(torch.uint8).clone()
    group.update_actor(with_advantages(out, [1.0, -1.0, 0.5, -0.5], old_log_probs))
    group.update_weights()
    q, scale = quantize_rows(actor_weight.detach())
    after = engine.fp8.layers[layer_name]
    assert torch.equal(after.weight.view(torch.uint8), q.view(torch.uint8)) and torch.equal(after.weight_scale, scale)
    assert not torch.equal(after.weight.view(torch.uint8), before)
    assert engine.weights_version == worker._weights_version == 1
