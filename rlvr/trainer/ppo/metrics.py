"""Per-step metrics of the PPO trainer, computed on the driver from the step's batch.

Names follow verl where verl has one (``critic/score/mean``, ``response_length/clip_ratio``,
``timing/gen``, ``perf/throughput``); per data source: ``train/<source>/score``,
``train/<source>/acc`` (and ``val/<source>/score``, ``val/<source>/acc`` in validation).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from rlvr.protocol import DataProto
from rlvr.reward.contract import ACC_THRESHOLD
from rlvr.utils.torch_functional import masked_mean, masked_sum


def sample_accuracy(scores: torch.Tensor, reward_extra_info: dict[str, Sequence[Any]]) -> np.ndarray:
    """Per-sample correctness ``[batch]`` (float 0/1): the reward function's ``acc`` where it reports
    one, else ``score >= 1`` (a routed batch mixes samples with and without ``acc``).

    Args:
        scores: sequence scores ``[batch]``.
        reward_extra_info: the reward function's per-sample extras (lists of length batch, None where
            a sample has no value).
    """
    correct = scores.detach().cpu().numpy() >= ACC_THRESHOLD
    if "acc" in reward_extra_info:
        correct = np.array([bool(acc) if acc is not None else fallback
                            for acc, fallback in zip(reward_extra_info["acc"], correct)])
    return correct.astype(np.float64)


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    values = values.float()
    if values.numel() == 0:
        return {}
    return {f"{prefix}/mean": values.mean().item(), f"{prefix}/max": values.max().item(),
            f"{prefix}/min": values.min().item()}


def per_source_metrics(prefix: str, sources: Sequence[str], scores: Sequence[float],
                       acc: Sequence[float]) -> dict[str, float]:
    """``<prefix>/<source>/score`` and ``<prefix>/<source>/acc`` (means over the samples of each
    data source) and ``<prefix>/acc`` over all samples."""
    by_source: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for source, score, correct in zip(sources, scores, acc):
        by_source[str(source)].append((float(score), float(correct)))
    metrics = {}
    for source, pairs in sorted(by_source.items()):
        metrics[f"{prefix}/{source}/score"] = float(np.mean([p[0] for p in pairs]))
        metrics[f"{prefix}/{source}/acc"] = float(np.mean([p[1] for p in pairs]))
    if len(acc):
        metrics[f"{prefix}/acc"] = float(np.mean(acc))
    return metrics


def compute_data_metrics(batch: DataProto, use_critic: bool) -> dict[str, float]:
    """Scores, rewards, advantages, returns, values, lengths and per-source accuracy of a trained batch.

    Expects ``token_level_scores``, ``token_level_rewards``, ``advantages``, ``returns``,
    ``responses``, ``response_mask``, ``attention_mask`` (``values`` with a critic) in ``batch.batch``
    and ``data_source``, ``acc`` in ``batch.non_tensor_batch``.
    """
    tensors = batch.batch
    response_mask = tensors["response_mask"].bool()
    max_response = tensors["responses"].shape[-1]
    prompt_mask = tensors["attention_mask"][:, :-max_response].bool()
    response_length = response_mask.sum(-1).float()
    prompt_length = prompt_mask.sum(-1).float()
    max_prompt = prompt_mask.shape[-1]
    scores = tensors["token_level_scores"].sum(-1)
    metrics = {
        **_stats("critic/score", scores),
        **_stats("critic/rewards", tensors["token_level_rewards"].sum(-1)),
        **_stats("critic/advantages", torch.masked_select(tensors["advantages"], response_mask)),
        **_stats("critic/returns", torch.masked_select(tensors["returns"], response_mask)),
        **_stats("response_length", response_length),
        "response_length/clip_ratio": (response_length >= max_response).float().mean().item(),
        **_stats("prompt_length", prompt_length),
        "prompt_length/clip_ratio": (prompt_length >= max_prompt).float().mean().item(),
    }
    if use_critic:
        values = torch.masked_select(tensors["values"], response_mask)
        returns = torch.masked_select(tensors["returns"], response_mask)
        metrics.update(_stats("critic/values", values))
        return_var = torch.var(returns)
        metrics["critic/vf_explained_var"] = (1.0 - torch.var(returns - values) / (return_var + 1e-5)).item()
    metrics.update(per_source_metrics("train", batch.non_tensor_batch["data_source"], scores.tolist(),
                                      batch.non_tensor_batch["acc"].tolist()))
    return metrics


def compute_timing_metrics(batch: DataProto, timing_raw: dict[str, float]) -> dict[str, float]:
    """``timing/<stage>`` in seconds and ``timing_per_token/<stage>`` in milliseconds per token
    (generation per response token, other stages per prompt + response token)."""
    response_tokens = batch.batch["response_mask"].sum().item()
    all_tokens = batch.batch["attention_mask"].sum().item()
    metrics = {f"timing/{name}": seconds for name, seconds in timing_raw.items()}
    for name, seconds in timing_raw.items():
        if name == "step":
            continue
        tokens = response_tokens if name == "gen" else all_tokens
        if tokens:
            metrics[f"timing_per_token/{name}"] = 1000.0 * seconds / tokens
    return metrics


def compute_throughput_metrics(batch: DataProto, timing_raw: dict[str, float], n_workers: int) -> dict[str, float]:
    """``perf/total_num_tokens``, ``perf/time_per_step`` and ``perf/throughput`` (tokens per second
    of the whole step, all workers together) and ``perf/throughput_per_worker``."""
    tokens = float(batch.batch["attention_mask"].sum().item())
    step = timing_raw["step"]
    return {"perf/total_num_tokens": tokens, "perf/time_per_step": step,
            "perf/throughput": tokens / step, "perf/throughput_per_worker": tokens / step / n_workers}


def compute_variance_proxy_metrics(batch: DataProto, gradient_norm: float | None = None) -> dict[str, float]:
    """verl's gradient-variance proxies of a trained batch that has ``sum_pi_squared``
    (``actor.calculate_sum_pi_squared``), from the logit-gradient proxy of the optimal token baseline
    (Li et al. 2026, arXiv:2602.07078): a response's squared score-function norm is about
    ``W = sum_t (1 - 2 pi_t + sum_v pi_t(v)^2)`` (times ``rho_t^2`` with IS weights), and its
    gradient's about ``A^2 W`` with ``A`` the response's mean advantage. Empty without the inputs.

    Returns:
        ``variance_proxy/proxy1_signal_strength`` (``gradient_norm^2`` of the update, 0 without it),
        ``/proxy2_total_power`` (``mean(A^2 W)``; with IS weights ``mean(rho^2 A^2 W)``, ``rho`` the
        response's mean weight and ``W`` unweighted), ``/proxy3_pure_noise``
        (``max(0, (proxy2 - proxy1) / (N - 1))`` over ``N`` responses, 0 without a gradient norm),
        ``/expected_a_squared`` and ``/expected_w``.
    """
    tensors = batch.batch
    if not all(key in tensors.keys() for key in ("sum_pi_squared", "old_log_probs", "advantages")):
        return {}
    mask = tensors["response_mask"].float()
    energy = 1.0 - 2.0 * tensors["old_log_probs"].float().exp() + tensors["sum_pi_squared"].float()
    weights = tensors["rollout_is_weights"].float() if "rollout_is_weights" in tensors.keys() else None
    if weights is not None:
        energy = energy * weights.square()
    advantage = masked_mean(tensors["advantages"].float(), mask, axis=-1)
    path = masked_sum(energy, mask, axis=-1)
    if weights is None:
        total_power = (advantage.square() * path.clamp(min=0.0)).mean()
    else:
        unweighted = masked_sum(energy / weights.square().clamp(min=1e-10), mask, axis=-1).clamp(min=0.0)
        total_power = (masked_mean(weights, mask, axis=-1).square() * advantage.square() * unweighted).mean()
    signal = gradient_norm ** 2 if gradient_norm is not None else 0.0
    rows = advantage.shape[0]
    noise = max(0.0, (total_power.item() - signal) / (rows - 1)) if gradient_norm is not None and rows > 1 else 0.0
    return {"variance_proxy/proxy1_signal_strength": float(signal),
            "variance_proxy/proxy2_total_power": total_power.item(), "variance_proxy/proxy3_pure_noise": noise,
            "variance_proxy/expected_a_squared": advantage.square().mean().item(),
            "variance_proxy/expected_w": path.mean().item()}


def reduce_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """Average list-valued metrics (as workers return them per micro-batch) to one float each."""
    return {key: float(np.mean(value)) if isinstance(value, (list, tuple, np.ndarray)) else float(value)
            for key, value in metrics.items()}
