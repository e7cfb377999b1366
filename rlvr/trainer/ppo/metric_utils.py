"""Metrics of the PPO trainer, at verl's path ``verl.trainer.ppo.metric_utils`` with verl's names.

Per training step (driver side, from the step's batch): :func:`compute_data_metrics` (scores,
rewards, advantages, returns, values, lengths: ``critic/score/mean``, ``response_length/clip_ratio``,
...), :func:`compute_timing_metrics` (``timing_s/<stage>``, ``timing_per_token_ms/<stage>``),
:func:`compute_throughout_metrics` (``perf/throughput``: tokens per second per GPU, verl's spelling
of the name), :func:`compute_variance_proxy_metrics`, and rlvr's per-source accuracy
(:func:`per_source_metrics`: ``train/<source>/score``, ``train/<source>/acc``, ``train/acc``).

Validation (:mod:`rlvr.trainer.ppo.validation_metrics`, re-exported here): verl's
:func:`process_validation_metrics`, :func:`bootstrap_metric`, :func:`calc_maj_val` and rlvr's
pass@k; the MoE load-balance metrics of the rollout live in :mod:`rlvr.trainer.ppo.moe_metrics`.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from rlvr.protocol import DataProto
from rlvr.trainer.ppo.validation_metrics import (
    bootstrap_metric,
    calc_maj_val,
    compute_validation_metrics,
    flatten_validation_metrics,
    pass_at_k,
    process_pass_at_k_metrics,
    process_validation_metrics,
)
from rlvr.utils.metric import reduce_metrics
from rlvr.utils.torch_functional import masked_mean, masked_sum

__all__ = [
    "bootstrap_metric",
    "calc_maj_val",
    "compute_data_metrics",
    "compute_throughout_metrics",
    "compute_timing_metrics",
    "compute_validation_metrics",
    "compute_variance_proxy_metrics",
    "flatten_validation_metrics",
    "pass_at_k",
    "per_source_metrics",
    "process_pass_at_k_metrics",
    "process_validation_metrics",
    "reduce_metrics",
    "sample_accuracy",
]

logger = logging.getLogger(__name__)

ACC_THRESHOLD = 1.0
"""Without an ``acc`` from the reward manager, a sample counts as correct when its score is >= 1."""

PER_TOKEN_STAGES = ("ref", "values", "adv", "update_critic", "update_actor")
"""Stages whose per-token time counts prompt and response tokens (``gen`` counts response tokens)."""


def _compute_response_info(batch: DataProto) -> dict[str, torch.Tensor]:
    """``prompt_length`` and ``response_length`` ``[batch]`` (float): the batch's own columns of
    these names if it has both, else the 1s of ``attention_mask`` before / in the last
    ``responses.shape[-1]`` positions."""
    if "prompt_length" in batch.batch and "response_length" in batch.batch:
        return {"prompt_length": batch.batch["prompt_length"], "response_length": batch.batch["response_length"]}
    width = batch.batch["responses"].shape[-1]
    attention = batch.batch["attention_mask"]
    return {"prompt_length": attention[:, :-width].sum(-1).float(),
            "response_length": attention[:, -width:].sum(-1).float()}


def _mean_max_min(prefix: str, values: torch.Tensor, what: str) -> dict[str, float]:
    """``<prefix>/mean``, ``/max``, ``/min`` of ``values`` (``nan`` with a warning when empty)."""
    if values.numel() == 0:
        logger.warning("no %s in the batch, %s/* are nan", what, prefix)
        return {f"{prefix}/mean": float("nan"), f"{prefix}/max": float("nan"), f"{prefix}/min": float("nan")}
    values = values.detach().float()
    return {f"{prefix}/mean": values.mean().item(), f"{prefix}/max": values.max().item(),
            f"{prefix}/min": values.min().item()}


def compute_data_metrics(batch: DataProto, use_critic: bool = True) -> dict[str, Any]:
    """Statistics of a trained batch (verl's names and definitions).

    Reads ``token_level_scores``, ``token_level_rewards``, ``advantages``, ``returns``, ``prompts``,
    ``responses``, ``response_mask``, ``attention_mask`` (all ``[batch, ...]``), ``values`` with
    ``use_critic``; optional non-tensor ``__num_turns__`` and ``tool_call_counts``.

    Returns:
        ``critic/{score,rewards}/{mean,max,min}`` over samples with a non-empty response;
        ``critic/{advantages,returns}/{mean,max,min}`` over response tokens; with a critic
        ``critic/values/*`` and ``critic/vf_explained_var`` (``1 - var(returns - values) /
        (var(returns) + 1e-5)``); ``response_length/{mean,max,min,clip_ratio}`` over all samples and
        ``response_length_non_aborted/*`` over those with a response (``response/aborted_ratio``: the
        share without); ``prompt_length/{mean,max,min,clip_ratio}``; ``num_turns/*`` and
        ``tool_call_counts/*`` when the batch has them. A clip ratio is the share at the full width.
    """
    tensors = batch.batch
    scores, rewards = tensors["token_level_scores"].sum(-1), tensors["token_level_rewards"].sum(-1)
    max_prompt, max_response = tensors["prompts"].shape[-1], tensors["responses"].shape[-1]
    token_mask = tensors["response_mask"].bool()
    info = _compute_response_info(batch)
    prompt_length, response_length = info["prompt_length"], info["response_length"]
    answered = response_length != 0
    returns = torch.masked_select(tensors["returns"], token_mask)
    metrics = {
        **_mean_max_min("critic/score", scores[answered], "sample with a response"),
        **_mean_max_min("critic/rewards", rewards[answered], "sample with a response"),
        **_mean_max_min("critic/advantages", torch.masked_select(tensors["advantages"], token_mask), "response token"),
        **_mean_max_min("critic/returns", returns, "response token"),
    }
    if use_critic:
        values = torch.masked_select(tensors["values"], token_mask)
        metrics.update(_mean_max_min("critic/values", values, "response token"))
        explained = float("nan")
        if returns.numel() and values.numel():
            explained = (1.0 - torch.var(returns - values) / (torch.var(returns) + 1e-5)).item()
        metrics["critic/vf_explained_var"] = explained
    metrics.update(_mean_max_min("response_length", response_length, "sample"))
    metrics["response_length/clip_ratio"] = (response_length == max_response).float().mean().item()
    kept = response_length[answered]
    metrics.update(_mean_max_min("response_length_non_aborted", kept, "sample with a response"))
    metrics["response_length_non_aborted/clip_ratio"] = (
        (kept == max_response).float().mean().item() if kept.numel() else float("nan"))
    metrics["response/aborted_ratio"] = (~answered).float().mean().item()
    metrics.update(_mean_max_min("prompt_length", prompt_length, "sample"))
    metrics["prompt_length/clip_ratio"] = (prompt_length == max_prompt).float().mean().item()
    for key, name in (("__num_turns__", "num_turns"), ("tool_call_counts", "tool_call_counts")):
        if key in batch.non_tensor_batch:
            column = np.asarray(batch.non_tensor_batch[key])
            metrics.update({f"{name}/min": column.min(), f"{name}/max": column.max(), f"{name}/mean": column.mean()})
    return metrics


def compute_timing_metrics(batch: DataProto, timing_raw: dict[str, float]) -> dict[str, Any]:
    """``timing_s/<stage>`` (seconds, every stage of ``timing_raw``) and ``timing_per_token_ms/<stage>``
    (milliseconds per token: ``gen`` per response token; ``ref``, ``values``, ``adv``,
    ``update_critic``, ``update_actor`` per prompt + response token; 0.0 without tokens)."""
    info = _compute_response_info(batch)
    response_tokens = torch.sum(info["response_length"]).item()
    all_tokens = torch.sum(info["prompt_length"]).item() + response_tokens
    tokens = {"gen": response_tokens, **{stage: all_tokens for stage in PER_TOKEN_STAGES}}
    metrics: dict[str, Any] = {f"timing_s/{name}": seconds for name, seconds in timing_raw.items()}
    for name in tokens.keys() & timing_raw.keys():
        metrics[f"timing_per_token_ms/{name}"] = timing_raw[name] * 1000 / tokens[name] if tokens[name] > 0 else 0.0
    return metrics


def compute_throughout_metrics(batch: DataProto, timing_raw: dict[str, float], n_gpus: int) -> dict[str, Any]:
    """``perf/total_num_tokens`` (sum of ``meta_info["global_token_num"]``, the per-sample token
    counts), ``perf/time_per_step`` (``timing_raw["step"]``) and ``perf/throughput``: tokens per
    second per GPU (worker), ``total / (time * n_gpus)``.

    Raises:
        KeyError: the batch has no ``meta_info["global_token_num"]`` (set it to
            ``attention_mask.sum(-1).tolist()`` as the trainer does).
    """
    if "global_token_num" not in batch.meta_info:
        raise KeyError("compute_throughout_metrics needs batch.meta_info['global_token_num'] (the token count of "
                       "each sample, attention_mask.sum(-1).tolist())")
    total = sum(batch.meta_info["global_token_num"])
    seconds = timing_raw["step"]
    return {"perf/total_num_tokens": total, "perf/time_per_step": seconds, "perf/throughput": total / (seconds * n_gpus)}


def compute_variance_proxy_metrics(batch: DataProto, gradient_norm: float | None = None) -> dict[str, float]:
    """Cheap proxies of the policy-gradient variance from the score-norm approximation
    ``E||g||^2 ~ E[A^2 W]`` with ``W = sum_t (1 - 2 pi_t(y_t) + sum_v pi_t(v)^2)`` (verl's metrics).

    Needs ``sum_pi_squared``, ``old_log_probs``, ``advantages``, ``response_mask`` ``[batch,
    response_len]`` (an empty dict otherwise); with ``rollout_is_weights`` the per-token ``W`` is
    scaled by the squared IS weight and the total power uses the sequence-mean IS weight.

    Returns:
        ``variance_proxy/proxy1_signal_strength`` (``gradient_norm^2``, 0 when not given),
        ``proxy2_total_power`` (``E[A^2 W]``, or ``E[rho^2 A^2 W]`` with IS weights),
        ``proxy3_pure_noise`` (``max(0, (proxy2 - proxy1) / (batch - 1))``, 0 without a norm or
        with one sample), ``expected_a_squared``, ``expected_w``.
    """
    tensors = batch.batch
    if not all(key in tensors for key in ("sum_pi_squared", "old_log_probs", "advantages")):
        return {}
    mask = tensors["response_mask"]
    w_token = 1 - 2 * torch.exp(tensors["old_log_probs"]) + tensors["sum_pi_squared"]
    is_weights = tensors["rollout_is_weights"] if "rollout_is_weights" in tensors else None
    if is_weights is not None:
        w_token = w_token * (is_weights ** 2).detach()
    advantage = masked_mean(tensors["advantages"], mask, axis=-1)  # [batch]
    w_seq = masked_sum(w_token, mask, axis=-1)  # [batch]
    if is_weights is not None:
        rho = masked_mean(is_weights, mask, axis=-1)
        w_plain = masked_sum(w_token / torch.clamp((is_weights ** 2).detach(), min=1e-10), mask, axis=-1)
        total_power = (rho ** 2 * advantage ** 2 * torch.clamp(w_plain, min=0.0)).mean()
    else:
        total_power = (advantage ** 2 * torch.clamp(w_seq, min=0.0)).mean()
    signal = gradient_norm ** 2 if gradient_norm is not None else None
    noise = 0.0
    if signal is not None and advantage.shape[0] > 1:
        noise = max(0.0, float((total_power - signal) / (advantage.shape[0] - 1)))
    return {"variance_proxy/proxy1_signal_strength": signal if signal is not None else 0.0,
            "variance_proxy/proxy2_total_power": total_power.detach().item(),
            "variance_proxy/proxy3_pure_noise": noise,
            "variance_proxy/expected_a_squared": (advantage ** 2).mean().detach().item(),
            "variance_proxy/expected_w": w_seq.mean().detach().item()}


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


def per_source_metrics(prefix: str, sources: Sequence[str], scores: Sequence[float],
                       acc: Sequence[float]) -> dict[str, float]:
    """rlvr's short summary: ``<prefix>/<source>/score`` and ``<prefix>/<source>/acc`` (means over the
    samples of each data source) and ``<prefix>/acc`` over all samples (acc as :func:`sample_accuracy`)."""
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
