"""FP8 rollout (``rollout.quantization=fp8``): the HF engine's linear layers in float8 e4m3.

Every ``nn.Linear`` of the policy except the output head (and any whose sizes are not multiples of
16, which the fp8 matrix units require) becomes an :class:`Fp8Linear`: its weight ``[out, in]`` is
stored as e4m3 with one float32 scale per output channel, ``scale = max|W[o, :]| / 448`` (448 is
e4m3's largest value), re-quantised from the actor's weights at every weight sync. The input is
quantised the same way per row (per token, dynamically, at every call), so the layer computes::

    y = (q(x) @ q(W)^T) * scale_x * scale_W^T (+ bias)     accumulated in float32, cast to x's dtype

(W8A8 with dynamic per-token activation scales and per-channel weight scales, the scheme vLLM
runs for ``quantization="fp8"`` with channel-wise weights.) On a CUDA device of compute capability
8.9 or more the product runs through ``torch._scaled_mm`` (the fp8 tensor cores, row-wise scales
in the kernel's epilogue); elsewhere it is emulated exactly: the e4m3 operands are widened to
float32, multiplied with float32 accumulation and scaled, which is the same function up to the
order of the float32 sums. So the feature is tested on CPU and the engine's log-probs are always
those of the fp8 model.

The engine's log-probs are therefore not the actor's: the engine reports them inexact, the actor
recomputes ``old_log_probs``, the trainer's mismatch metrics show the gap every step and
``algorithm.rollout_correction`` (truncated importance sampling, rejection) corrects for it.

Quantisation error of one weight, in units of its channel's scale (e4m3: 3 mantissa bits,
smallest normal ``2**-6``, subnormal step ``2**-9``): at most ``2**-4`` of the value for values
whose scaled size is at least ``2**-6`` (relative rounding of a 3-bit mantissa), at most ``2**-10``
(half a subnormal step) below; the largest value of each channel is represented exactly.

The fp8 copy: with one rank the engine shares the actor's module, so the quantised layers live in a
structural copy of it that shares every other parameter (embeddings, norms, the head) with the
actor, and they stay on the device between phases (one byte per linear weight; the emulation keeps
a float32 widening of each e4m3 weight beside it, made once per sync). When the engine
owns its module (several ranks), the linear layers are replaced in that module itself.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator

import torch
from torch import nn

from rlvr.workers.rollout.base import Weights, as_named_tensors

__all__ = ["E4M3", "E4M3_MAX", "Fp8Linear", "Fp8Weights", "quantize_rows", "scaled_matmul",
           "fp8_matmul_supported", "rollout_fp8_weights"]

logger = logging.getLogger(__name__)

E4M3 = torch.float8_e4m3fn
E4M3_MAX = float(torch.finfo(E4M3).max)
"""448: the largest finite e4m3 value; a row's largest magnitude is scaled onto it."""
MIN_AMAX = 1e-12
"""Floor of a row's largest magnitude (an all-zero row gets a tiny scale instead of a division by 0)."""
ALIGNMENT = 16
"""The fp8 matrix product needs both sizes of a weight to be multiples of this."""


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Absmax quantisation of each row to e4m3.

    Args:
        x: ``[rows, cols]`` any float dtype.

    Returns:
        ``(q [rows, cols] float8_e4m3fn, scale [rows, 1] float32)`` with ``x ~= q * scale`` and
        ``scale = max|x[r, :]| / 448`` (at least ``MIN_AMAX / 448``).
    """
    wide = x.float()
    scale = wide.abs().amax(dim=-1, keepdim=True).clamp(min=MIN_AMAX) / E4M3_MAX
    return (wide / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), scale


def fp8_matmul_supported(device: torch.device) -> bool:
    """True where ``torch._scaled_mm`` runs: a CUDA device of compute capability 8.9+ (Ada, Hopper)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


def scaled_matmul(x_q: torch.Tensor, x_scale: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor,
                  out_dtype: torch.dtype, use_kernel: bool, fast_accum: bool = False) -> torch.Tensor:
    """``(x_q @ w_q^T) * x_scale * w_scale^T``, float32 accumulation, cast to ``out_dtype``.

    Args:
        x_q: ``[rows, in]`` e4m3 activations; ``x_scale`` ``[rows, 1]`` float32.
        w_q: ``[out, in]`` e4m3 weight (for the emulation also its exact float32 widening);
            ``w_scale`` ``[out, 1]`` float32.
        out_dtype: dtype of the result ``[rows, out]``.
        use_kernel: ``torch._scaled_mm`` (fp8 tensor cores); False: the float32 emulation.
        fast_accum: the kernel's ``use_fast_accum`` (fewer bits kept in its running sums; off in
            rlvr, measured by ``benchmarks/fp8_accumulation.py``).
    """
    if not use_kernel:
        accumulated = x_q.float() @ w_q.float().t()
        return (accumulated * x_scale * w_scale.t()).to(out_dtype)
    if out_dtype == torch.bfloat16:  # row-wise scales in the kernel's epilogue (bf16 output only)
        return torch._scaled_mm(x_q, w_q.t(), scale_a=x_scale, scale_b=w_scale.t(), out_dtype=torch.bfloat16,
                                use_fast_accum=fast_accum)
    one = torch.ones((), dtype=torch.float32, device=x_q.device)
    accumulated = torch._scaled_mm(x_q, w_q.t(), scale_a=one, scale_b=one, out_dtype=torch.float32,
                                   use_fast_accum=fast_accum)
    return (accumulated * x_scale * w_scale.t()).to(out_dtype)


class Fp8Linear(nn.Module):
    """A linear layer computing with an e4m3 weight and per-output-channel scales (see the module
    docstring for the function it computes).

    Args:
        linear: the layer it replaces (its weight is quantised; its bias, if any, is kept as is and
            shared, not copied).
        device: where the e4m3 weight and its scales live.
        use_kernel: compute with ``torch._scaled_mm`` (True) or the exact emulation (False).
    """

    def __init__(self, linear: nn.Linear, device: torch.device, use_kernel: bool) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.use_kernel = use_kernel
        self.register_buffer("weight", torch.empty(self.out_features, self.in_features, dtype=E4M3, device=device))
        self.register_buffer("weight_scale", torch.empty(self.out_features, 1, dtype=torch.float32, device=device))
        # the emulation multiplies the e4m3 values widened to float32 (exact); widening at every call
        # would cost more than the product on CPU, so it is done once per weight sync
        widened = None if use_kernel else torch.empty(self.out_features, self.in_features, device=device)
        self.register_buffer("weight_widened", widened, persistent=False)
        self.bias = linear.bias
        self.set_weight(linear.weight.detach())

    @torch.no_grad()
    def set_weight(self, weight: torch.Tensor) -> None:
        """Re-quantise from a full-precision weight ``[out, in]``, in place (the buffers keep their
        addresses, so a captured CUDA graph stays valid)."""
        if tuple(weight.shape) != (self.out_features, self.in_features):
            raise ValueError(f"Fp8Linear expects a weight of shape {(self.out_features, self.in_features)}, "
                             f"got {tuple(weight.shape)}")
        q, scale = quantize_rows(weight.to(self.weight.device))
        self.weight.copy_(q)
        self.weight_scale.copy_(scale)
        if self.weight_widened is not None:
            self.weight_widened.copy_(q.float())

    def dequantized_weight(self) -> torch.Tensor:
        """The weight the layer computes with, ``q * scale`` ``[out, in]`` float32."""
        return self.weight.float() * self.weight_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [..., in] -> [..., out]`` in ``x``'s dtype."""
        rows = x.reshape(-1, self.in_features)
        x_q, x_scale = quantize_rows(rows)
        weight = self.weight if self.weight_widened is None else self.weight_widened
        out = scaled_matmul(x_q, x_scale, weight, self.weight_scale, x.dtype, self.use_kernel)
        if self.bias is not None:
            out = out + self.bias.to(out.dtype)
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"e4m3 per-channel, kernel={'scaled_mm' if self.use_kernel else 'emulated'}")


def _quantizable(name: str, module: nn.Module, head: nn.Module | None) -> bool:
    return (isinstance(module, nn.Linear) and module is not head
            and module.in_features % ALIGNMENT == 0 and module.out_features % ALIGNMENT == 0)


class Fp8Weights:
    """The fp8 layers of one rollout engine and the module that uses them.

    Args:
        module: the policy model the engine was given.
        device: the engine's device (where the e4m3 weights live).
        copy_structure: True when ``module`` is the actor's own (shared): the fp8 layers go into a
            structural copy that shares all other parameters with it; False: the linear layers of
            ``module`` itself are replaced (the engine owns it).

    Attributes:
        module: the module the engine generates with.
        layers: ``{weight name: Fp8Linear}``, by the policy's parameter names (``...q_proj.weight``).
    """

    def __init__(self, module: nn.Module, device: torch.device, copy_structure: bool) -> None:
        if copy_structure:  # parameters shared, everything else (config, buffers) copied
            module = copy.deepcopy(module, memo={id(p): p for p in module.parameters()})
        self.module = module
        use_kernel = fp8_matmul_supported(device)
        if not use_kernel:
            logger.info("rollout.quantization=fp8 on %s: fp8 matrix products emulated in float32 (exact, slower; "
                        "the fp8 kernels need a CUDA device of compute capability 8.9+)", device)
        head = module.get_output_embeddings()
        targets = [(name, child) for name, child in module.named_modules() if _quantizable(name, child, head)]
        if not targets:
            raise ValueError("rollout.quantization=fp8: the model has no linear layer whose sizes are multiples "
                             f"of {ALIGNMENT} to quantise")
        self.layers: dict[str, Fp8Linear] = {}
        for name, linear in targets:
            parent_name, _, attr = name.rpartition(".")
            layer = Fp8Linear(linear, device, use_kernel)
            setattr(module.get_submodule(parent_name), attr, layer)
            self.layers[f"{name}.weight"] = layer

    def load(self, weights: Weights) -> Iterator[tuple[str, torch.Tensor]]:
        """Re-quantise the fp8 layers from the named weights among ``weights`` and yield the other
        ``(name, tensor)`` pairs (for the engine's ordinary in-place copy)."""
        for name, tensor in as_named_tensors(weights):
            layer = self.layers.get(name)
            if layer is None:
                yield name, tensor
            else:
                layer.set_weight(tensor)

    def nbytes(self) -> int:
        """Bytes of the e4m3 weights and their scales (without the emulation's float32 copies)."""
        return sum(layer.weight.nbytes + layer.weight_scale.nbytes for layer in self.layers.values())


def rollout_fp8_weights(quantization: str | None, module: nn.Module, device: torch.device,
                        owns_module: bool) -> Fp8Weights | None:
    """The HF engine's fp8 layers for ``rollout.quantization`` (None: off).

    Raises:
        ValueError: a quantization other than ``fp8``.
    """
    if quantization is None:
        return None
    if quantization != "fp8":
        raise ValueError(f"rollout.quantization={quantization!r} is not supported by the hf engine; use fp8 or null")
    return Fp8Weights(module, device, copy_structure=not owns_module)
