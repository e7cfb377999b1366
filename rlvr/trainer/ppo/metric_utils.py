"""Metrics of the PPO trainer, at verl's path ``verl.trainer.ppo.metric_utils`` with verl's names.

Per training step (driver side, from the step's batch): :func:`compute_data_metrics` (scores,
rewards, advantages, returns, values, lengths: ``critic/score/mean``, ``response_length/clip_ratio``,
...), :func:`compute_timing_metrics` (``timing_s/<stage>``, ``timing_per_token_ms/<stage>``),
:func:`compute_throughout_metrics` (``perf/throughput``: tokens per second per GPU, verl's spelling
of the name), :func:`compute_variance_proxy_metrics`, and rlvr's per-source accuracy
(:func:`per_source_metrics`: ``train/<source>/score``, ``train/<source>/acc``, ``train/acc``).

Validation (:mod:`rlvr.trainer.ppo.validation_metrics`, re-exported here): verl's
:func:`process_validation_metrics`, :func:`bootstrap_metric`, :func:`calc_maj_val` and rlvr's
pass@k. The MoE load-balance metrics of the rollout's expert routing (``rollout/moe/...``:
:func:`compute_rollout_moe_load_balance_metrics`, :class:`RolloutMoELoadBalanceMetricsAccumulator`) are
verl's, for engines that return the ``routed_experts`` of each token.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from transformers import AutoConfig

from rlvr.protocol import DataProto
from rlvr.reward.contract import ACC_THRESHOLD
from rlvr.trainer.ppo.validation_metrics import (
    bootstrap_metric,
    calc_maj_val,
    compute_validation_metrics,
    flatten_validation_metrics,
    pass_at_k,
    process_pass_at_k_metrics,
    process_validation_metrics,
)
from rlvr.utils.fs import copy_to_local
from rlvr.utils.metric import reduce_metrics
from rlvr.utils.model import update_model_config
from rlvr.utils.torch_functional import masked_mean, masked_sum

__all__ = [
    "RolloutMoELoadBalanceMetricsAccumulator",
    "bootstrap_metric",
    "calc_maj_val",
    "compute_data_metrics",
    "compute_moe_lb_metrics",
    "compute_rollout_moe_load_balance_metrics",
    "compute_throughout_metrics",
    "compute_timing_metrics",
    "compute_validation_metrics",
    "compute_variance_proxy_metrics",
    "flatten_validation_metrics",
    "get_hf_config_override_kwargs",
    "get_metric_data_with_optional_routed_experts",
    "infer_moe_num_experts",
    "infer_rollout_moe_num_experts",
    "pass_at_k",
    "per_source_metrics",
    "process_pass_at_k_metrics",
    "process_validation_metrics",
    "reduce_metrics",
    "sample_accuracy",
]

logger = logging.getLogger(__name__)


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


# ------------------------------------------------------------------ MoE load balance of the rollout
MOE_PREFIX = "rollout/moe"
LOCAL_EXPERT_MODEL_TYPES = ("gpt_oss", "mixtral")
"""Model types whose ``num_local_experts`` is the number of routed experts (others use ``num_experts``
or ``n_routed_experts``)."""


def _field(config: Any, name: str, default: Any = None) -> Any:
    """``config[name]`` of a dict-like config, else its attribute (``default`` when absent)."""
    return config.get(name, default) if hasattr(config, "get") else getattr(config, name, default)


def get_hf_config_override_kwargs(override_config: Any) -> dict[str, Any]:
    """The Hugging Face config overrides of a model section's ``override_config`` (its
    ``model_config`` entry when it has one); ``{}`` for none."""
    if isinstance(override_config, DictConfig):
        override_config = OmegaConf.to_container(override_config, resolve=True)
    if not override_config:
        return {}
    return override_config["model_config"] if "model_config" in override_config else override_config


def infer_moe_num_experts(model_config: Any) -> int | None:
    """Routed experts of a model, from a config or dict: its own, its ``hf_config`` (and that one's
    ``text_config``), ``text_config`` or ``override_config`` (and its ``model_config`` /
    ``text_config``); ``num_experts`` or ``n_routed_experts``, or ``num_local_experts`` for
    gpt_oss / mixtral. None when none of them says."""
    candidates = [model_config]
    for name, inner in (("hf_config", ("text_config",)), ("text_config", ()), ("override_config", ("model_config", "text_config"))):
        section = _field(model_config, name)
        if section is not None:
            candidates.append(section)
            candidates += [sub for sub in (_field(section, key) for key in inner) if sub is not None]
    for candidate in candidates:
        for name in ("num_experts", "n_routed_experts"):
            if _field(candidate, name) is not None:
                return int(_field(candidate, name))
        if _field(candidate, "model_type") in LOCAL_EXPERT_MODEL_TYPES and _field(candidate, "num_local_experts") is not None:
            return int(_field(candidate, "num_local_experts"))
    return None


def infer_rollout_moe_num_experts(model_config: Any) -> int | None:
    """:func:`infer_moe_num_experts`, else from the model's Hugging Face config (``local_hf_config_path``,
    ``hf_config_path`` or ``path``, with ``override_config`` applied); None without a path."""
    found = infer_moe_num_experts(model_config)
    if found is not None:
        return found
    path = (_field(model_config, "local_hf_config_path") or _field(model_config, "hf_config_path")
            or _field(model_config, "path"))
    if path is None:
        return None
    hf_config = AutoConfig.from_pretrained(copy_to_local(path, use_shm=bool(_field(model_config, "use_shm", False))),
                                           trust_remote_code=bool(_field(model_config, "trust_remote_code", False)))
    overrides = get_hf_config_override_kwargs(_field(model_config, "override_config", {}))
    if overrides:
        update_model_config(hf_config, overrides)
    return infer_moe_num_experts(hf_config)


def _compute_rollout_moe_load_counts(routed_experts: torch.Tensor | None, response_mask: torch.Tensor | None,
                                     num_experts: int | None) -> torch.Tensor | None:
    """Assignments per expert ``[layers, experts]`` of the response tokens.

    Args:
        routed_experts: ``[batch, seq, layers, topk]`` expert ids; its last ``response_len`` positions
            are the response's.
        response_mask: ``[batch, response_len]``.
        num_experts: routed experts per layer.

    Each sequence's last valid response position is left out: the last sampled token never goes
    through the model, so its slot holds filler, not a routing. None when an input is missing, of the
    wrong shape, or no token is left; ids outside ``[0, num_experts)`` are refused with a warning.
    """
    if routed_experts is None or response_mask is None or not num_experts or num_experts <= 0:
        return None
    if routed_experts.dim() != 4:
        logger.warning(f"routed_experts should be [batch, seq, layers, topk], got shape {tuple(routed_experts.shape)}")
        return None
    if response_mask.dim() != 2 or response_mask.shape[0] != routed_experts.shape[0]:
        logger.warning(f"response_mask {tuple(response_mask.shape)} does not match routed_experts "
                       f"{tuple(routed_experts.shape)}")
        return None
    width = response_mask.shape[1]
    if width == 0:
        return None
    if routed_experts.shape[1] < width:
        logger.warning(f"routed_experts has {routed_experts.shape[1]} positions, fewer than the {width} of the response")
        return None
    mask = response_mask.to(device=routed_experts.device, dtype=torch.bool)
    positions = torch.arange(width, device=mask.device)
    last = torch.where(mask, positions, torch.full_like(positions, -1)).amax(dim=-1, keepdim=True)  # [batch, 1]
    mask = mask & (positions != last)
    chosen = routed_experts[:, -width:][mask].detach().to("cpu", torch.long)  # [tokens, layers, topk]
    if chosen.numel() == 0:
        return None
    if chosen.min() < 0 or chosen.max() >= num_experts:
        logger.warning(f"expert ids outside [0, {num_experts}) (min {chosen.min().item()}, max {chosen.max().item()}): "
                       "no rollout MoE load-balance metrics")
        return None
    return torch.stack([torch.bincount(chosen[:, layer].reshape(-1), minlength=num_experts)
                        for layer in range(chosen.shape[1])])


def _load_balance_metrics(load_counts: torch.Tensor | None, prefix: str = MOE_PREFIX) -> dict[str, Any]:
    """Per layer the share of each expert times the experts minus 1 (0 = perfectly balanced): its
    max (``max_vio``), min (``min_vio``) and mean absolute value (``avg_vio``), then their max and
    mean over the layers."""
    if load_counts is None or load_counts.numel() == 0:
        return {}
    share = load_counts.float() / load_counts.float().sum(dim=1, keepdim=True).clamp_min(1.0)
    deviation = share * share.shape[1] - 1.0  # [layers, experts]
    stats = {"max_vio": deviation.max(dim=1).values, "min_vio": deviation.min(dim=1).values,
             "avg_vio": deviation.abs().mean(dim=1)}
    metrics: dict[str, Any] = {}
    for layer in range(share.shape[0]):
        for name, values in stats.items():
            metrics[f"{prefix}/{name}/layer_{layer}"] = values[layer].item()
    for name, values in stats.items():
        metrics[f"{prefix}/{name}/max"] = values.max().item()
        metrics[f"{prefix}/{name}/avg"] = values.mean().item()
    return metrics


def compute_rollout_moe_load_balance_metrics(routed_experts: torch.Tensor | None, response_mask: torch.Tensor | None,
                                             num_experts: int | None, prefix: str = MOE_PREFIX) -> dict[str, Any]:
    """Load-balance metrics of the experts the rollout routed the response tokens to (see
    :func:`_compute_rollout_moe_load_counts` and :func:`_load_balance_metrics`); ``{}`` without data."""
    return _load_balance_metrics(_compute_rollout_moe_load_counts(routed_experts, response_mask, num_experts), prefix)


class RolloutMoELoadBalanceMetricsAccumulator:
    """Expert assignment counts summed over the steps of a logging interval.

    Args:
        model_config: where the number of experts is read from when an update does not give it.
    """

    def __init__(self, model_config: Any | None = None) -> None:
        self.model_config = model_config
        self.load_counts: torch.Tensor | None = None
        self.num_experts: int | None = None
        self.num_experts_initialized = False
        self.routed_experts_retry_after_step = 0
        self.warned_skip_keys: set[str] = set()

    def should_request_routed_experts(self, global_steps: int) -> bool:
        return global_steps >= self.routed_experts_retry_after_step

    def defer_routed_experts_retry(self, global_steps: int, interval: int) -> None:
        self.routed_experts_retry_after_step = global_steps + max(interval, 1)

    def warn_skip_once(self, key: str, message: str) -> None:
        """Log ``message`` the first time ``key`` is warned about."""
        if key not in self.warned_skip_keys:
            self.warned_skip_keys.add(key)
            logger.warning(message)

    def _infer_num_experts(self) -> int | None:
        if not self.num_experts_initialized:
            self.num_experts_initialized = True
            if self.model_config is not None:
                try:
                    self.num_experts = infer_rollout_moe_num_experts(self.model_config)
                except (OSError, ValueError, KeyError) as err:
                    self.warn_skip_once("num_experts_exception", f"cannot read the number of experts from the model config: {err}")
            if self.num_experts is None:
                self.warn_skip_once("num_experts_missing", "no rollout MoE load-balance metrics: the number of experts is "
                                    "not in actor_rollout_ref.model nor in the model's Hugging Face config")
        return self.num_experts

    def update(self, routed_experts: torch.Tensor | None, response_mask: torch.Tensor | None,
               num_experts: int | None = None) -> bool:
        """Add a batch's counts; False when it gave none."""
        counts = _compute_rollout_moe_load_counts(routed_experts, response_mask,
                                                  num_experts if num_experts is not None else self._infer_num_experts())
        if counts is None:
            return False
        if self.load_counts is not None and self.load_counts.shape != counts.shape:
            logger.warning(f"expert counts changed shape from {tuple(self.load_counts.shape)} to {tuple(counts.shape)}: "
                           "starting the interval again")
            self.load_counts = None
        self.load_counts = counts if self.load_counts is None else self.load_counts + counts
        return True

    def compute(self, prefix: str = MOE_PREFIX) -> dict[str, Any]:
        return _load_balance_metrics(self.load_counts, prefix)

    def total_assignments(self) -> int:
        return int(self.load_counts.sum().item()) if self.load_counts is not None else 0

    def reset(self) -> None:
        self.load_counts = None

    def pop_metrics(self, prefix: str = MOE_PREFIX) -> dict[str, Any]:
        """The interval's metrics; the counts start again."""
        metrics = self.compute(prefix)
        self.reset()
        return metrics


def get_metric_data_with_optional_routed_experts(keys: list[str], partition_id: str, fields: list[str],
                                                 moe_lb_metrics_interval: int, global_steps: int,
                                                 accumulator: RolloutMoELoadBalanceMetricsAccumulator,
                                                 kv_batch_get: Any) -> Any:
    """``kv_batch_get(keys=, partition_id=, select_fields=)`` with ``routed_experts`` added to the
    fields when the load-balance metrics are on and due; if the store has no such field, the fields
    alone, and ``routed_experts`` is not asked for again for one interval."""
    if moe_lb_metrics_interval <= 0 or not accumulator.should_request_routed_experts(global_steps):
        return kv_batch_get(keys=keys, partition_id=partition_id, select_fields=fields)
    try:
        return kv_batch_get(keys=keys, partition_id=partition_id, select_fields=[*fields, "routed_experts"])
    except ValueError as err:
        if "routed_experts" not in str(err):
            raise
        accumulator.defer_routed_experts_retry(global_steps, moe_lb_metrics_interval)
        accumulator.warn_skip_once("missing_routed_experts", f"no rollout MoE load-balance metrics: {err}")
        return kv_batch_get(keys=keys, partition_id=partition_id, select_fields=fields)


def compute_moe_lb_metrics(metrics_batch: DataProto, moe_lb_metrics_interval: int, global_steps: int,
                           accumulator: RolloutMoELoadBalanceMetricsAccumulator) -> dict[str, Any]:
    """Add the batch's ``routed_experts`` to ``accumulator``; every ``moe_lb_metrics_interval`` steps
    return the interval's metrics with ``rollout/moe/routed_experts_found`` and
    ``rollout/moe/routed_expert_assignments`` (``{}`` between, and with the interval <= 0)."""
    if moe_lb_metrics_interval <= 0:
        return {}
    updated = accumulator.update(routed_experts=metrics_batch.batch.get("routed_experts", None),
                                 response_mask=metrics_batch.batch.get("response_mask", None))
    if global_steps % moe_lb_metrics_interval != 0:
        return {}
    assignments = accumulator.total_assignments()
    metrics = accumulator.pop_metrics()
    metrics[f"{MOE_PREFIX}/routed_experts_found"] = float(assignments > 0)
    metrics[f"{MOE_PREFIX}/routed_expert_assignments"] = assignments
    if not updated and assignments == 0:
        accumulator.warn_skip_once("no_routed_expert_counts", "no rollout MoE load-balance metrics: no routed expert "
                                   "counts in the batches of this interval")
    return metrics
