"""Pipeline-parallel send and receive of hidden states, wired into autograd.

rlvr runs the pipeline stages of one micro-batch one after another (no 1F1B interleaving; it
splits the model's memory over the stages, not its time), with plain ``torch.distributed``
point-to-point calls, on CPU (gloo) and GPU alike. Every stage runs the same micro-batches and
computes the same loss value: the last stage broadcasts its log-probs (or values) to the other
stages, which add a zero that carries their pipeline link (:func:`send_forward`), so one
``loss.backward()`` on every stage drives the whole pipeline backward:

- stage ``s > 0`` receives its input with :func:`receive_forward`; in training, a hook on the
  received tensor sends its gradient back to stage ``s - 1`` as soon as it is computed;
- stage ``s < last`` sends its output with :func:`send_forward`, which returns a zero scalar: its
  backward receives the output's gradient from stage ``s + 1`` (and ignores its own incoming
  gradient, which the zero makes meaningless).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["receive_forward", "send_forward", "broadcast_from_last_stage"]


def receive_forward(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, src: int) -> torch.Tensor:
    """The previous stage's output ``shape`` from global rank ``src``; with grad enabled, its
    gradient goes back to ``src`` when the backward pass reaches it."""
    tensor = torch.empty(shape, dtype=dtype, device=device)
    dist.recv(tensor, src=src)
    if torch.is_grad_enabled():
        tensor.requires_grad_(True)
        tensor.register_hook(lambda grad: _send(grad, src))
    return tensor


def _send(grad: torch.Tensor, dst: int) -> None:
    dist.send(grad.contiguous(), dst=dst)


class _SendForward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: torch.Tensor, dst: int) -> torch.Tensor:
        dist.send(hidden.detach().contiguous(), dst=dst)
        ctx.dst, ctx.shape, ctx.dtype, ctx.device = dst, hidden.shape, hidden.dtype, hidden.device
        return hidden.new_zeros(())

    @staticmethod
    def backward(ctx, _grad: torch.Tensor):
        grad = torch.empty(ctx.shape, dtype=ctx.dtype, device=ctx.device)
        dist.recv(grad, src=ctx.dst)
        return grad, None


def send_forward(hidden: torch.Tensor, dst: int) -> torch.Tensor:
    """Send this stage's output to global rank ``dst``; returns a zero scalar whose backward receives
    the output's gradient from ``dst`` (add it to something the loss uses)."""
    if not torch.is_grad_enabled() or not hidden.requires_grad:
        dist.send(hidden.detach().contiguous(), dst=dst)
        return hidden.new_zeros(())
    return _SendForward.apply(hidden, dst)


def broadcast_from_last_stage(tensors: list[torch.Tensor | None], shapes: list[tuple[int, ...]], last: bool,
                              src: int, group, device: torch.device) -> list[torch.Tensor]:
    """The last stage's float32 tensors on every stage of the pipeline (detached copies elsewhere;
    the last stage keeps its own, with their autograd history)."""
    out = []
    for tensor, shape in zip(tensors, shapes):
        buffer = tensor.detach().float().contiguous() if last else torch.empty(shape, device=device)
        dist.broadcast(buffer, src=src, group=group)
        out.append(tensor if last else buffer)
    return out
