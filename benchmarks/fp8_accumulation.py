"""How far ``torch._scaled_mm`` (fp8 tensor cores) is from the exact sum, on the GPU.

For random e4m3 operands with per-row scales (the shapes of the SmolLM2 projections), prints and
writes ``--json`` the error of the kernel (bf16 and float32 output, ``use_fast_accum`` off and on)
and of rlvr's float32 emulation against a float64 reference, in units of
``sum_i |x_i w_i|`` (the bound of a K-term sum in precision u is ``K * u`` of it)::

    python -m benchmarks.fp8_accumulation --json fp8_accumulation.json     # needs CUDA, sm 8.9+
"""

from __future__ import annotations

import argparse
import json

import torch

from rlvr.workers.rollout.fp8 import quantize_rows, scaled_matmul


def measure(rows: int, inner: int, cols: int, out_dtype: torch.dtype, fast_accum: bool, seed: int = 0) -> dict:
    """Error statistics of one ``[rows, inner] @ [inner, cols]`` fp8 product (kernel and emulation)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(rows, inner, device="cuda", generator=gen) * torch.logspace(-2, 1, rows, device="cuda")[:, None]
    w = torch.randn(cols, inner, device="cuda", generator=gen) * torch.logspace(-3, 0, cols, device="cuda")[:, None]
    x_q, x_scale = quantize_rows(x.to(out_dtype))
    w_q, w_scale = quantize_rows(w)
    scales = x_scale.double() * w_scale.double().t()
    exact = (x_q.double() @ w_q.double().t()) * scales
    magnitude = (x_q.double().abs() @ w_q.double().abs().t()) * scales
    kernel = scaled_matmul(x_q, x_scale, w_q, w_scale, out_dtype, use_kernel=True, fast_accum=fast_accum)
    emulated = scaled_matmul(x_q, x_scale, w_q, w_scale, out_dtype, use_kernel=False)
    stats = {}
    for name, result in (("kernel", kernel), ("emulation", emulated)):
        error = (result.double() - exact).abs()
        relative = error / magnitude
        stats[name] = {"max_over_magnitude": float(relative.max()), "mean_over_magnitude": float(relative.mean()),
                       "max_abs": float(error.max()),
                       "bits": float(-torch.log2(relative.max()))}
    return {"shape": [rows, inner, cols], "out_dtype": str(out_dtype), "fast_accum": fast_accum, **stats}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    results = [measure(rows, inner, cols, dtype, fast)
               for rows, inner, cols in ((37, 256, 512), (256, 576, 1536), (256, 1536, 576))
               for dtype in (torch.bfloat16, torch.float32) for fast in (False, True)]
    for r in results:
        print(json.dumps(r), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "results": results}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
