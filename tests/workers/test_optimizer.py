"""Optimizer and LR schedule builders (rlvr.workers.optimizer) and the gradient norm over shards."""

import math

import pytest
import torch
from omegaconf import OmegaConf

from rlvr.trainer.config.schema import OptimConfig
from rlvr.workers.fsdp import clip_grad_norm
from rlvr.workers.optimizer import build_lr_scheduler, build_optimizer


def lrs(**optim) -> list[float]:
    config = OmegaConf.structured(OptimConfig(lr=1.0, **optim))
    optimizer = build_optimizer(torch.nn.Linear(2, 1), config)
    scheduler = build_lr_scheduler(optimizer, config)
    out = []
    for _ in range(6):
        out.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    return out


def test_warmup_then_constant():
    assert lrs(warmup_steps=2) == pytest.approx([0.5, 1.0, 1.0, 1.0, 1.0, 1.0])


def test_warmup_ratio_then_cosine_to_the_floor():
    got = lrs(warmup_steps_ratio=0.25, total_training_steps=8, lr_scheduler_type="cosine", min_lr_ratio=0.1)
    cosine = [0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * k / 6)) for k in range(4)]
    assert got == pytest.approx([0.5, 1.0, *cosine])


def test_cosine_without_total_steps_is_rejected():
    with pytest.raises(ValueError, match="total_training_steps > 0"):
        lrs(lr_scheduler_type="cosine")


def test_clip_grad_norm_reports_the_norm_and_nan():
    layer = torch.nn.Linear(2, 1, bias=False)
    layer.weight.grad = torch.tensor([[3.0, 4.0]])
    assert clip_grad_norm(layer, 1.0) == pytest.approx(5.0)
    assert layer.weight.grad.norm().item() == pytest.approx(1.0, rel=1e-5)
    layer.weight.grad = torch.tensor([[float("nan"), 1.0]])
    assert math.isnan(clip_grad_norm(layer, 1.0))
