"""Decode time against the memory-bandwidth floor: reading the weights and the KV cache once per step.

A decode step of a batch of ``rows`` sequences must read every weight once (``W`` bytes) and the
keys and values of every cached token (``kv`` bytes per token, ``rows x (P + t)`` tokens at step
``t``). At a bandwidth of ``B`` bytes/s the ``R`` steps cannot take less than::

    floor = sum_{t=0}^{R-1} (W + kv * rows * (P + t)) / B

The measured decode time is the generation stage minus one prefill (the prompt forward, timed
separately), so the ratio ``decode / floor`` says how close the decode loop is to the hardware.
"""

from __future__ import annotations

import statistics
import time

import torch

from benchmarks.workload import Workload, sync


def weight_bytes(module: torch.nn.Module) -> int:
    """Bytes of the parameters (tied ones once, biases included): what one decode step reads at least
    (the LM head over the whole vocabulary, of which the embedding lookup reads only a row)."""
    return sum(p.numel() * p.element_size() for p in module.parameters())


def kv_bytes_per_token(module: torch.nn.Module) -> int:
    """Bytes of keys plus values of one token over all layers (a Qwen2 config has no ``head_dim``:
    hidden size over query heads)."""
    cfg = module.config.get_text_config(decoder=True)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    element = next(module.parameters()).element_size()
    return cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * head_dim * element


def floor_seconds(weights: int, kv_per_token: int, rows: int, prompt_len: int, steps: int,
                  bytes_per_s: float) -> float:
    """The read floor of ``steps`` decode steps (see the module docstring)."""
    tokens = rows * (steps * prompt_len + steps * (steps - 1) // 2)
    return (steps * weights + kv_per_token * tokens) / bytes_per_s


@torch.no_grad()
def prefill_seconds(module: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    position_ids: torch.Tensor, device: torch.device, repeats: int = 3) -> float:
    """Median wall time of one prompt forward (with cache, last-token logits), as in generation."""
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        module(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
               position_ids=position_ids.to(device), use_cache=True, logits_to_keep=1)
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def decode_report(rlvr_side, work: Workload, bytes_per_s: float, generation_s: float) -> dict:
    """Decode time of rlvr's generation stage against the read floor, for the first prompt batch."""
    module = rlvr_side.worker.rollout.module
    prompts = rlvr_side.batches[0].repeat(work.samples, interleave=True)
    input_ids = prompts.batch["input_ids"]
    weights, kv = weight_bytes(module), kv_bytes_per_token(module)
    floor = floor_seconds(weights, kv, input_ids.shape[0], input_ids.shape[1], work.response_len, bytes_per_s)
    prefill = prefill_seconds(module, input_ids, prompts.batch["attention_mask"], prompts.batch["position_ids"],
                              rlvr_side.device)
    decode = generation_s - prefill
    return {"weight_bytes": weights, "kv_bytes_per_token": kv, "rows": int(input_ids.shape[0]),
            "prompt_len": int(input_ids.shape[1]), "steps": work.response_len, "bandwidth_bytes_per_s": bytes_per_s,
            "floor_s": floor, "generation_s": generation_s, "prefill_s": prefill, "decode_s": decode,
            "decode_over_floor": decode / floor}
