"""FP8 rollout on CUDA: ``torch._scaled_mm`` computes what the CPU-tested emulation computes, the
compiled static-cache decode runs the fp8 layers, and the hybrid worker re-quantises at every sync.
Each test needs a CUDA device of compute capability 8.9+ (skipped elsewhere)."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from rlvr.single_controller import ClassWithInitArgs, LocalResourcePool, LocalWorkerGroup
from rlvr.trainer.config.schema import RolloutConfig
from rlvr.utils.testing import save_tiny_model, tiny_causal_lm
from rlvr.workers.engine_workers import ActorRolloutRefWorker
from rlvr.workers.rollout import HFRollout
from rlvr.workers.rollout.fp8 import Fp8Linear, fp8_matmul_supported, quantize_rows, scaled_matmul
from tests.workers.model_worker_utils import make_config, prompt_batch, with_advantages

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or not fp8_matmul_supported(torch.device("cuda")),
                       reason="needs a CUDA device of compute capability 8.9+ (fp8 tensor cores)"),
]


HOPPER_ACCUMULATOR_BITS = 14
"""Hopper's fp8 tensor cores keep fewer bits than float32 in their running sums: on an H200
(2026-11-27, ``benchmarks/fp8_accumulation.py``) the kernel's float32 output was off the exact sum
by up to 1.3e-4 of ``sum |x_i w_i|`` (about 13 bits), the float32 emulation by 3.5e-8. The bound
below takes 14 bits per addition, the worst case for K additions."""


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_scaled_mm_equals_the_emulation(dtype):
    torch.manual_seed(0)
    x = (torch.randn(37, 256, device="cuda") * torch.logspace(-2, 1, 37, device="cuda")[:, None]).to(dtype)
    w = torch.randn(512, 256, device="cuda") * torch.logspace(-3, 0, 512, device="cuda")[:, None]
    x_q, x_scale = quantize_rows(x)
    w_q, w_scale = quantize_rows(w)
    kernel = scaled_matmul(x_q, x_scale, w_q, w_scale, dtype, use_kernel=True)
    emulated = scaled_matmul(x_q, x_scale, w_q, w_scale, dtype, use_kernel=False)
    assert kernel.dtype == dtype and kernel.shape == (37, 512)
    # the classic bound of a K-term sum in precision u: |error| <= K * u * sum_i |x_i w_i|, plus the
    # rounding of the output (bf16: 2^-8 relative); a wrong scale or layout is off by O(1) of that sum
    scales = x_scale.double() * w_scale.double().t()
    exact = (x_q.double() @ w_q.double().t()) * scales
    magnitude = (x_q.double().abs() @ w_q.double().abs().t()) * scales
    output_rounding = 2.0**-8 if dtype == torch.bfloat16 else 2.0**-21
    bound = x.shape[1] * 2.0**-HOPPER_ACCUMULATOR_BITS * magnitude + output_rounding * exact.abs() + 1e-30
    for name, result in (("kernel", kernel), ("emulation", emulated)):
        error = (result.double() - exact).abs()
        assert bool((error <= bound).all()), f"{name}: worst error / bound {float((error / bound).max()):.3g}"
    # and the float32 emulation is exact up to float32 rounding (its products are exact)
    emulation_error = (emulated.double() - exact).abs()
    assert bool((emulation_error <= x.shape[1] * 2.0**-24 * magnitude + output_rounding * exact.abs()).all())


def _engine(model, tokenizer, **overrides) -> HFRollout:
    config = OmegaConf.merge(OmegaConf.structured(RolloutConfig), {
        "response_length": 16, "prompt_length": 32, "do_sample": False, "quantization": "fp8", **overrides})
    return HFRollout(config, model, tokenizer, "cuda", seed=1, owns_module=False)


def test_compiled_fp8_decode_matches_the_eager_fp8_engine():
    model, tokenizer = tiny_causal_lm(hidden_size=64, intermediate_size=128, seed=5, dtype=torch.bfloat16)
    model = model.cuda()
    prompts = prompt_batch(["1+1=", "hello there, how are", "abc"], do_sample=False)
    eager = _engine(model, tokenizer)
    assert all(layer.use_kernel for layer in eager.fp8.layers.values())
    assert isinstance(eager.module.model.layers[0].mlp.up_proj, Fp8Linear)
    plain = eager.generate_sequences(prompts)
    fast_engine = _engine(model, tokenizer, static_cache=True, compile=True)
    for _ in range(2):  # the second call replays the captured graph
        fast = fast_engine.generate_sequences(prompts)
        assert torch.equal(fast.batch["response_mask"], plain.batch["response_mask"])
        mask = plain.batch["response_mask"].bool()
        same = (fast.batch["responses"] == plain.batch["responses"])[mask].float().mean()
        assert same > 0.9  # greedy ids; bf16 fused kernels may flip a near tie
        assert plain.meta_info["rollout_log_probs_exact"] is False


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    return str(save_tiny_model(tmp_path_factory.mktemp("gpu_fp8_model") / "model", hidden_size=64,
                               intermediate_size=128, seed=11))


def test_hybrid_worker_requantizes_on_cuda(tiny_model_dir):
    config = make_config(tiny_model_dir, "actor_rollout_ref.rollout.quantization=fp8",
                         "actor_rollout_ref.rollout.response_length=8", "actor_rollout_ref.actor.optim.lr=0.01")
    group = LocalWorkerGroup(LocalResourcePool(use_gpu=True), ClassWithInitArgs(ActorRolloutRefWorker, config,
                                                                                 "actor_rollout"))
    group.init_model()
    worker = group._workers[0]
    name = "model.layers.1.self_attn.o_proj.weight"
    out = group.generate_sequences(prompt_batch(temperature=1.0))
    old = group.compute_log_prob(out)
    mask = out.batch["response_mask"].bool()
    gap = (old.batch["old_log_probs"] - out.batch["rollout_log_probs"]).abs()[mask]
    assert 0 < gap.max() < 1.0  # the fp8 gap, small on a tiny random model
    group.update_actor(with_advantages(out, [1.0, -1.0, 0.5, -0.5], old.batch["old_log_probs"]))
    group.update_weights()
    layer = worker.rollout.fp8.layers[name]
    q, scale = quantize_rows(dict(worker.actor_module.named_parameters())[name].detach().cuda())
    assert layer.weight.is_cuda and torch.equal(layer.weight.view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(layer.weight_scale, scale)
