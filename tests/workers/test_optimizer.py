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


def lr_list(steps: int = 6, **optim) -> list[float]:
    config = OmegaConf.structured(OptimConfig(lr=2.0, **optim))
    optimizer = build_optimizer(torch.nn.Linear(2, 1), config)
    scheduler = build_lr_scheduler(optimizer, config)
    out = []
    for _ in range(steps):
        out.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    return out


def test_verls_step_counting_of_warmup_and_cosine():
    """verl's get_cosine_schedule_with_warmup: lr(s) = s / w in warmup, then
    max(m, m + (1 - m) (1 + cos(2 pi c p)) / 2), p = (s - w) / (T - w); zero_indexed_step=False adds 1 to s."""
    def verl(s, w=2, total=8, m=0.1, c=0.5):
        if s < w:
            return 2.0 * s / w
        p = (s - w) / (total - w)
        return 2.0 * max(m, m + (1 - m) * 0.5 * (1 + math.cos(2 * math.pi * c * p)))

    cosine = {"warmup_steps": 2, "total_training_steps": 8, "lr_scheduler_type": "cosine", "min_lr_ratio": 0.1}
    assert lr_list(**cosine, zero_indexed_step=True) == pytest.approx([verl(s) for s in range(6)])
    assert lr_list(**cosine, zero_indexed_step=False) == pytest.approx([verl(s + 1) for s in range(6)])
    two_waves = lr_list(8, **{**cosine, "num_cycles": 1.0}, zero_indexed_step=True)
    assert two_waves == pytest.approx([verl(s, c=1.0) for s in range(8)])
    assert two_waves[-1] > two_waves[4]  # a full wave rises again towards the end


def test_megatrons_decay_styles():
    """Megatron's OptimizerParamScheduler, by hand: warmup from lr_warmup_init over w steps (lr at
    step w), then the decay to min_lr at lr_decay_steps, min_lr after."""
    base = {"warmup_steps": 2, "total_training_steps": 10, "min_lr": 0.2, "lr_warmup_init": 0.5}
    warm = [0.5, 1.25, 2.0]  # 0.5 + 1.5 * s / 2
    assert lr_list(7, lr_decay_style="constant", **base) == pytest.approx(warm + [2.0] * 4)
    linear = [0.2 + (1 - (s - 2) / 6) * 1.8 for s in range(3, 8)]  # lr_decay_steps 8
    assert lr_list(10, lr_decay_style="linear", lr_decay_steps=8, **base) == pytest.approx(warm + linear + [0.2] * 2)
    cosine = [0.2 + 0.5 * (math.cos(math.pi * (s - 2) / 8) + 1) * 1.8 for s in range(3, 8)]
    assert lr_list(8, lr_decay_style="cosine", **base) == pytest.approx(warm + cosine)
    inv = [max(0.2, 2.0 * math.sqrt(2) / math.sqrt(s)) for s in range(3, 8)]
    assert lr_list(8, lr_decay_style="inverse-square-root", **base) == pytest.approx(warm + inv)
    # WSD: stable until step 10 - 4 = 6, then the exponential anneal 2 * 0.5 ** r - 1 over 4 steps
    wsd = [2.0] * 4 + [0.2 + (2 * 0.5 ** ((s - 6) / 4) - 1) * 1.8 for s in range(7, 11)]
    assert lr_list(11, lr_decay_style="WSD", lr_wsd_decay_steps=4, **base) == pytest.approx(warm + wsd)
    with pytest.raises(ValueError, match="lr_wsd_decay_steps"):
        lr_list(lr_decay_style="WSD", **base)


def test_the_optimizer_class_and_its_arguments_come_from_the_config():
    sgd = build_optimizer(torch.nn.Linear(2, 1), OmegaConf.structured(OptimConfig(
        lr=0.5, optimizer="SGD", override_optimizer_config={"momentum": 0.9})))
    assert type(sgd) is torch.optim.SGD and sgd.defaults["momentum"] == 0.9 and sgd.defaults["lr"] == 0.5
    adam = build_optimizer(torch.nn.Linear(2, 1), OmegaConf.structured(OptimConfig(optimizer="adam", betas=[0.8, 0.9])))
    assert type(adam) is torch.optim.AdamW and adam.defaults["betas"] == (0.8, 0.9)  # Megatron's adam
    with pytest.raises(ValueError, match="cannot be loaded"):
        build_optimizer(torch.nn.Linear(2, 1), OmegaConf.structured(OptimConfig(optimizer="Nope")))


def test_verls_clip_grad_wins_over_grad_clip():
    from rlvr.trainer.config import load_config
    from rlvr.workers.optimizer import max_grad_norm

    actor = load_config(None, ["actor_rollout_ref.actor.grad_clip=0.7"]).actor_rollout_ref.actor
    assert max_grad_norm(actor) == 0.7
    verl = load_config(None, ["actor_rollout_ref.actor.optim.clip_grad=0.3"]).actor_rollout_ref.actor
    assert max_grad_norm(verl) == 0.3
