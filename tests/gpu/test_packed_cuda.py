"""Packing on CUDA: PyTorch's flash-attention varlen kernel (bf16) and per-sequence SDPA (fp32) give
the padded forward's log-probs. Needs a CUDA device (skipped elsewhere)."""

from __future__ import annotations

import pytest
import torch

from rlvr.workers.packed_attention import segment_sdpa, varlen_kernel_attention
from tests.workers.packed_batches import make_actor, random_batch, tiny_model

pytestmark = pytest.mark.gpu


def test_varlen_kernel_equals_per_sequence_sdpa_in_bf16():
    from torch.nn.attention.varlen import varlen_attn

    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, heads, 45, 64, device="cuda", dtype=torch.bfloat16, generator=gen) for heads in (8, 2, 2))
    cu = torch.tensor([0, 1, 20, 45], dtype=torch.int32, device="cuda")
    out = varlen_kernel_attention(varlen_attn, q, k, v, cu, 25, None, None)[0]
    reference = segment_sdpa(q.float(), k.float(), v.float(), cu, None)[0]
    torch.testing.assert_close(out.float(), reference, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_log_probs_equal_padded_on_cuda(dtype):
    batch = {key: value.cuda() for key, value in random_batch(rows=6, seed=1).items()}
    padded = make_actor(tiny_model("llama").to("cuda", dtype))
    packed = make_actor(tiny_model("llama").to("cuda", dtype), packed=True)
    padded.device = packed.device = torch.device("cuda")
    lp_a, _ = padded._forward(batch, 1.0, False, False)
    lp_b, _ = packed._forward(batch, 1.0, False, False)
    mask = batch["response_mask"].bool()
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    assert float((lp_a - lp_b)[mask].abs().max()) < tol
