"""Rollout correction: the rollout engine's log-probs against the actor's (pure torch).

The rollout engine (vLLM in bf16, other kernels, a stale copy of the weights) samples from a policy
``pi_rollout`` that is not exactly the actor's ``pi_old``. This module measures the gap every step
and, if asked, corrects for it, under verl's names (``algorithm.rollout_correction``):

- **Mismatch metrics** (:func:`compute_rollout_mismatch_metrics`, every step, any engine): max and
  mean ``|log pi_rollout - log pi_old|`` and ``|pi_rollout - pi_old|`` on response tokens, the KL
  between the two, the share of tokens over a threshold.
- **Truncated importance sampling** (``rollout_is``; Yao et al. 2025, "Your Efficient RL Framework
  Secretly Brings You Off-Policy RL Training"): each token's policy loss is multiplied by
  ``min(rho, rollout_is_threshold)`` (no gradient), where ``rho = pi_old / pi_rollout`` at the chosen
  level (token, sequence product, or sequence geometric mean).
- **Masked importance sampling / rejection** (``rollout_rs``; Liu, Li et al. 2025, "When Speed
  Kills Stability: Demystifying RL Collapse from the Training-Inference Mismatch"; token level is
  IcePop's masking, Ling Team 2025, arXiv:2510.18855): tokens or whole sequences whose ratio leaves
  ``[rollout_rs_threshold_lower, rollout_rs_threshold]`` are dropped from the loss (their
  ``response_mask`` becomes 0, so they leave the loss's denominator too).

The level of a ratio comes from a registry (``token``, ``sequence``, ``geometric``; register more
with :func:`register_rollout_ratio_level`). The weights reach the loss through the policy losses'
``rollout_is_weights`` argument (``pg_losses * rollout_is_weights``), as in verl.

All inputs are ``[batch, response_len]``; computed in float32; ratios are formed in log space and
clamped to ``exp(+-20)`` before ``exp``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from rlvr.protocol import DataProto
from rlvr.trainer.ppo.correction_thresholds import is_rs_option_list, is_threshold_bounds
from rlvr.trainer.ppo.rollout_rejection import rs_option_mask
from rlvr.utils.registry import Registry
from rlvr.utils.torch_functional import masked_mean, masked_sum

__all__ = [
    "ROLLOUT_RATIO_LEVELS", "SAFETY_BOUND", "register_rollout_ratio_level", "get_rollout_ratio_level",
    "compute_rollout_correction_weights", "compute_rollout_rejection_mask",
    "compute_rollout_correction_and_rejection_mask", "compute_rollout_correction_and_add_to_batch",
    "compute_rollout_mismatch_metrics", "bypass_old_log_probs", "BYPASS_RS_KEY", "bypass_correction",
    "bypass_metric_names", "compute_policy_loss_reinforce",
    "PROX_FROM_UPDATE_KEY", "prox_from_update_settings", "ProxFromUpdate",
]

BYPASS_RS_KEY = "bypass_rollout_rs"
"""``meta_info`` key: the bypass-mode settings the actor applies per micro-batch (the loss type, the
IS weights of ``loss_type=reinforce``, the rejection)."""

PROX_FROM_UPDATE_KEY = "prox_from_update"
"""``meta_info`` key: the actor takes the proximal (old) log-probs from its update's own forward pass
and applies the IS correction per micro-batch (:func:`prox_from_update_settings`)."""

SAFETY_BOUND = 20.0
"""Log-ratios are clamped to ``[-20, 20]`` before ``exp`` (weights stay in ``[2e-9, 5e8]``)."""

RatioLevelFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
ROLLOUT_RATIO_LEVELS: Registry[RatioLevelFn] = Registry("rollout correction level")


def register_rollout_ratio_level(name: str) -> Callable[[RatioLevelFn], RatioLevelFn]:
    """Register ``fn(log_ratio [B, R], response_mask [B, R]) -> [B, R]``: the log-ratio at this
    level, broadcast to every token of its sequence."""
    return ROLLOUT_RATIO_LEVELS.register(name)


def get_rollout_ratio_level(name: str) -> RatioLevelFn:
    """The level registered as ``name``; a miss raises ``KeyError`` listing the valid names."""
    return ROLLOUT_RATIO_LEVELS.get(name)


@register_rollout_ratio_level("token")
def token_log_ratio(log_ratio: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Each token's own ``log rho_t`` (biased, low variance)."""
    return log_ratio


@register_rollout_ratio_level("sequence")
def sequence_log_ratio(log_ratio: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``sum_t log rho_t`` over the sequence's valid tokens: the sequence likelihood ratio (unbiased,
    high variance)."""
    return masked_sum(log_ratio, response_mask, axis=-1).unsqueeze(-1).expand_as(log_ratio)


@register_rollout_ratio_level("geometric")
def geometric_log_ratio(log_ratio: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``mean_t log rho_t`` over the valid tokens: the geometric mean of the token ratios
    (length-normalised; verl's ``seq_mean_k1``)."""
    return masked_mean(log_ratio, response_mask, axis=-1).unsqueeze(-1).expand_as(log_ratio)


def _valid_min_max(values: torch.Tensor, valid: torch.Tensor) -> tuple[float, float]:
    picked = values[valid]
    return (picked.min().item(), picked.max().item()) if picked.numel() else (0.0, 0.0)


def compute_rollout_correction_weights(log_ratio: torch.Tensor, response_mask: torch.Tensor,
                                       rollout_is: str = "token", rollout_is_threshold: float | str = 2.0,
                                       rollout_is_batch_normalize: bool = False
                                       ) -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated importance-sampling weights ``min(rho, rollout_is_threshold)`` (TIS), or with a
    ``"lower_upper"`` threshold IcePop's: ``rho`` inside the band, 0 outside it.

    Args:
        log_ratio: ``[B, R]`` ``log pi_old - log pi_rollout`` per token.
        response_mask: ``[B, R]`` 1 on the tokens that count.
        rollout_is: ratio level from :data:`ROLLOUT_RATIO_LEVELS`.
        rollout_is_threshold: the cap (> 0), or ``"lower_upper"``.
        rollout_is_batch_normalize: divide the weights by their mean (over the valid tokens at the
            token level, over the sequences at a sequence level) so that they average 1
            (``rollout_is_batch_norm_factor``: that mean).

    Returns:
        ``(weights [B, R] float32, detached, 0 on padding; metrics)`` with ``rollout_is_mean``
        (mean applied weight), ``rollout_is_min`` / ``rollout_is_max`` (before the cap),
        ``rollout_is_ratio_fraction_high`` (share of tokens whose weight was capped) and
        ``rollout_is_eff_sample_size`` (``1 / mean((w / mean w)^2)``, as a fraction of the tokens).
    """
    raw, weights = _truncated_is(log_ratio, response_mask, rollout_is, rollout_is_threshold)
    metrics = _truncated_is_metrics(raw, weights, response_mask, is_threshold_bounds(rollout_is_threshold)[1])
    if rollout_is_batch_normalize:
        weights, metrics["rollout_is_batch_norm_factor"] = _batch_normalized(weights, response_mask, rollout_is)
    return weights, metrics


def _batch_normalized(weights: torch.Tensor, response_mask: torch.Tensor, rollout_is: str
                      ) -> tuple[torch.Tensor, float]:
    """The weights divided by their batch mean (per token, or per sequence for a sequence level),
    and that mean (1 when it is ~0: nothing to normalise)."""
    if rollout_is == "token":
        mean = masked_mean(weights, response_mask)
    else:
        rows = response_mask.sum(-1) > 0
        mean = masked_mean(weights, response_mask, axis=-1)[rows].mean() if bool(rows.any()) else weights.new_zeros(())
    if float(mean) <= 1e-8:
        return weights, 1.0
    return weights / mean, float(mean)


def _truncated_is(log_ratio: torch.Tensor, response_mask: torch.Tensor, rollout_is: str,
                  rollout_is_threshold: float | str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rho before the cap, the weights detached)``, both ``[B, R]`` float32 and 0 on padding:
    ``min(rho, cap)``, or IcePop's ``rho`` inside ``[lower, upper]`` and 0 outside."""
    lower, upper = is_threshold_bounds(rollout_is_threshold)
    mask = response_mask.float()
    level = get_rollout_ratio_level(rollout_is)(log_ratio.float(), mask)
    raw = torch.exp(level.clamp(-SAFETY_BOUND, SAFETY_BOUND)) * mask
    if lower is None:
        return raw, raw.clamp(max=upper).detach()
    return raw, torch.where((raw >= lower) & (raw <= upper), raw, torch.zeros_like(raw)).detach()


def _truncated_is_metrics(raw: torch.Tensor, weights: torch.Tensor, response_mask: torch.Tensor,
                          rollout_is_threshold: float) -> dict[str, float]:
    """The metrics of :func:`compute_rollout_correction_weights` from :func:`_truncated_is`'s tensors."""
    mask = response_mask.float()
    raw_min, raw_max = _valid_min_max(raw, mask > 0)
    mean = masked_mean(weights, mask)
    normalised = weights / mean.clamp(min=1e-8)
    return {
        "rollout_is_mean": mean.item(),
        "rollout_is_min": raw_min,
        "rollout_is_max": raw_max,
        "rollout_is_ratio_fraction_high": masked_mean((raw > rollout_is_threshold).float(), mask).item(),
        "rollout_is_eff_sample_size": 1.0 / masked_mean(normalised.square(), mask).clamp(min=1e-8).item(),
    }


def compute_rollout_rejection_mask(log_ratio: torch.Tensor, response_mask: torch.Tensor, rollout_rs: str = "token",
                                   rollout_rs_threshold: float = 2.0, rollout_rs_threshold_lower: float | None = None
                                   ) -> tuple[torch.Tensor, dict[str, float]]:
    """Masked importance sampling: drop tokens (or whole sequences) whose ratio leaves the band.

    A token is kept when ``lower <= rho <= upper`` for its ``rollout_rs``-level ratio ``rho``; with
    a sequence level all tokens of a sequence share the verdict.

    Args:
        log_ratio: ``[B, R]`` ``log pi_old - log pi_rollout`` per token.
        response_mask: ``[B, R]``.
        rollout_rs: ratio level from :data:`ROLLOUT_RATIO_LEVELS`.
        rollout_rs_threshold: upper bound of the band (> 1).
        rollout_rs_threshold_lower: lower bound (``None`` = ``1 / upper``; must be < upper).

    Returns:
        ``(modified_response_mask [B, R] (the input's dtype); metrics)`` with
        ``rollout_rs_masked_fraction`` (share of valid tokens dropped) and
        ``rollout_rs_seq_masked_fraction`` (share of sequences with at least one dropped token).
    """
    lower = 1.0 / rollout_rs_threshold if rollout_rs_threshold_lower is None else rollout_rs_threshold_lower
    if not 0 < lower < rollout_rs_threshold:
        raise ValueError(f"the rejection band needs 0 < lower < upper, got [{lower}, {rollout_rs_threshold}]")
    mask = response_mask.float()
    level = get_rollout_ratio_level(rollout_rs)(log_ratio.float(), mask)
    keep = (level >= math.log(lower)) & (level <= math.log(rollout_rs_threshold))
    valid = mask > 0
    dropped = valid & ~keep
    seq_valid = valid.any(dim=-1)
    seq_dropped = dropped.any(dim=-1)
    metrics = {
        "rollout_rs_masked_fraction": masked_mean(dropped.float(), mask).item(),
        "rollout_rs_seq_masked_fraction": (seq_dropped.sum() / seq_valid.sum().clamp(min=1)).item(),
    }
    return (response_mask * keep.to(response_mask.dtype)), metrics


def compute_rollout_correction_and_rejection_mask(
        old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor,
        rollout_is: str | None = None, rollout_is_threshold: float | str = 2.0,
        rollout_is_batch_normalize: bool = False, rollout_rs: str | None = None,
        rollout_rs_threshold: float | str | None = None, rollout_rs_threshold_lower: float | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
    """IS weights and the rejection mask in one call (verl's entry point, tensors in and out).

    Args:
        old_log_prob: ``[B, R]`` the actor's log-probs of the sampled tokens.
        rollout_log_prob: ``[B, R]`` the rollout engine's log-probs of the same tokens.
        response_mask: ``[B, R]``.
        rollout_is: IS level (``None`` = no weights).
        rollout_is_threshold: cap of the IS weights, or ``"lower_upper"`` (IcePop).
        rollout_is_batch_normalize: normalise the weights to mean 1.
        rollout_rs: rejection level (``None`` = no rejection), or verl's options
            (``token_k1``, ``seq_mean_k3``, ... comma-separated: :mod:`~rlvr.trainer.ppo.rollout_rejection`).
        rollout_rs_threshold: upper bound of the rejection band (``None`` = ``rollout_is_threshold``'s
            upper bound), ``"lower_upper"``, or verl's per-option thresholds.
        rollout_rs_threshold_lower: lower bound (``None`` = ``1 / upper``).

    Returns:
        ``(rollout_is_weights [B, R] or None, modified_response_mask [B, R], metrics)``; metric
        names carry verl's ``rollout_corr/`` prefix.
    """
    if old_log_prob.shape != rollout_log_prob.shape or old_log_prob.shape != response_mask.shape:
        raise ValueError(f"old_log_prob {tuple(old_log_prob.shape)}, rollout_log_prob "
                         f"{tuple(rollout_log_prob.shape)} and response_mask {tuple(response_mask.shape)} "
                         "must have the same [batch, response_len] shape")
    log_ratio = old_log_prob.float() - rollout_log_prob.float()
    weights, metrics = None, {}
    if rollout_is is not None:
        weights, is_metrics = compute_rollout_correction_weights(log_ratio, response_mask, rollout_is,
                                                                 rollout_is_threshold, rollout_is_batch_normalize)
        metrics.update(is_metrics)
    modified_mask = response_mask
    if rollout_rs is not None:
        modified_mask, rs_metrics = _rejection(log_ratio, response_mask, rollout_rs, rollout_rs_threshold,
                                               rollout_rs_threshold_lower, rollout_is_threshold)
        metrics.update(rs_metrics)
    return weights, modified_mask, {f"rollout_corr/{name}": value for name, value in metrics.items()}


def _rejection(log_ratio: torch.Tensor, response_mask: torch.Tensor, rollout_rs: str,
               threshold: float | str | None, lower: float | None, is_threshold: float | str
               ) -> tuple[torch.Tensor, dict[str, float]]:
    """The rejection mask of a ratio level (band ``[lower, upper]``) or of verl's options."""
    if is_rs_option_list(rollout_rs):
        return rs_option_mask(log_ratio, response_mask, rollout_rs,
                              is_threshold_bounds(is_threshold)[1] if threshold is None else threshold)
    if threshold is None:
        band_lower, upper = None, is_threshold_bounds(is_threshold)[1]
    else:
        band_lower, upper = is_threshold_bounds(threshold)
    return compute_rollout_rejection_mask(log_ratio, response_mask, rollout_rs, upper,
                                          band_lower if lower is None else lower)


def compute_rollout_correction_and_add_to_batch(batch: DataProto, rollout_corr_config
                                                ) -> tuple[DataProto, dict[str, float]]:
    """Apply ``algorithm.rollout_correction`` to a batch (verl's decoupled mode), in place.

    Reads ``old_log_probs``, ``rollout_log_probs`` and ``response_mask``; adds ``rollout_is_weights``
    (with ``rollout_is``) and replaces ``response_mask`` by the one without the rejected tokens (with
    ``rollout_rs``), so that everything after this stage (advantages, losses, ``response_length``
    metrics) sees only the kept tokens. Nothing happens when both are off.

    Returns:
        ``(batch, metrics)``.
    """
    rc, tensors = rollout_corr_config, batch.batch
    if rc.rollout_is is None and rc.rollout_rs is None:
        return batch, {}
    weights, tensors["response_mask"], metrics = compute_rollout_correction_and_rejection_mask(
        tensors["old_log_probs"], tensors["rollout_log_probs"], tensors["response_mask"],
        rollout_is=rc.rollout_is, rollout_is_threshold=rc.rollout_is_threshold,
        rollout_is_batch_normalize=rc.rollout_is_batch_normalize, rollout_rs=rc.rollout_rs,
        rollout_rs_threshold=rc.rollout_rs_threshold, rollout_rs_threshold_lower=rc.rollout_rs_threshold_lower)
    if weights is not None:
        tensors["rollout_is_weights"] = weights
    return batch, metrics


def compute_rollout_mismatch_metrics(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor,
                                     response_mask: torch.Tensor, threshold: float) -> dict[str, float]:
    """How far the rollout engine's log-probs are from the actor's, on the response tokens.

    Names follow verl: ``training/rollout_probs_diff_{valid,max,mean,std}`` (``|p_rollout - p_old|``,
    probabilities), ``rollout_corr/kl`` (``mean(log p_rollout - log p_old)``, the direct estimate of
    ``KL(pi_rollout || pi_old)`` on the rollout's own samples) and ``rollout_corr/k3_kl``
    (``mean(rho - 1 - log rho)``, ``rho = p_old / p_rollout``, non-negative). Added here:
    ``training/rollout_log_probs_diff_{max,mean}`` (``|log p_rollout - log p_old|``) and
    ``training/rollout_log_probs_diff_frac_over`` (share of tokens where that exceeds ``threshold``).
    An engine whose log-probs are the actor's own (reused) reports exactly 0 everywhere.

    Args:
        old_log_prob, rollout_log_prob, response_mask: ``[B, R]``.
        threshold: the per-token ``|log-prob difference|`` counted as a mismatch.

    Returns:
        The metrics; with no valid token only ``training/rollout_probs_diff_valid = 0``.
    """
    valid = response_mask > 0
    if not bool(valid.any()):
        return {"training/rollout_probs_diff_valid": 0.0}
    old, rollout = old_log_prob.float()[valid], rollout_log_prob.float()[valid]
    log_diff = (rollout - old).abs()
    prob_diff = (rollout.exp() - old.exp()).abs()
    log_ratio = (old - rollout).clamp(-SAFETY_BOUND, SAFETY_BOUND)
    return {
        "training/rollout_probs_diff_valid": 1.0,
        "training/rollout_probs_diff_max": prob_diff.max().item(),
        "training/rollout_probs_diff_mean": prob_diff.mean().item(),
        "training/rollout_probs_diff_std": prob_diff.std(unbiased=False).item(),
        "training/rollout_log_probs_diff_max": log_diff.max().item(),
        "training/rollout_log_probs_diff_mean": log_diff.mean().item(),
        "training/rollout_log_probs_diff_frac_over": (log_diff > threshold).float().mean().item(),
        "rollout_corr/kl": (rollout - old).mean().item(),
        "rollout_corr/k3_kl": (log_ratio.exp() - 1.0 - log_ratio).mean().item(),
    }


def bypass_old_log_probs(batch: DataProto, rollout_corr_config) -> dict[str, float]:
    """verl's bypass mode, in place: the rollout's log-probs become ``old_log_probs`` (no actor
    forward), so the PPO ratio is ``pi_theta / pi_rollout`` and its clip bounds the whole gap, the
    engine's residual mismatch included. With ``rollout_rs`` the actor also drops, in every
    micro-batch, the tokens whose residual ratio ``pi_theta / pi_rollout`` leaves the rejection band
    (:func:`bypass_correction`; the settings travel in ``meta_info[BYPASS_RS_KEY]``), and reports
    the ``rollout_corr/*`` statistics. With ``loss_type=reinforce`` the actor's loss is
    :func:`compute_policy_loss_reinforce` with the IS weights of ``pi_theta / pi_rollout``
    (``rollout_is``); with ``ppo_clip`` the IS weights are statistics only (the PPO ratio already
    is that ratio: applying them would count it twice), as in verl.

    Returns:
        ``actor/entropy`` (the Monte-Carlo estimate ``mean(-log p_rollout)``) and
        ``actor/bypass_mode`` = 1.
    """
    tensors, rc = batch.batch, rollout_corr_config
    tensors["old_log_probs"] = tensors["rollout_log_probs"].clone()
    if rc.rollout_rs is not None or rc.rollout_is is not None or rc.loss_type != "ppo_clip":
        batch.meta_info[BYPASS_RS_KEY] = {
            "loss_type": rc.loss_type, "rollout_is": rc.rollout_is, "rollout_is_threshold": rc.rollout_is_threshold,
            "rollout_is_batch_normalize": bool(rc.rollout_is_batch_normalize), "rollout_rs": rc.rollout_rs,
            "rollout_rs_threshold": rc.rollout_rs_threshold, "rollout_rs_threshold_lower": rc.rollout_rs_threshold_lower}
    return {"actor/entropy": masked_mean(-tensors["old_log_probs"], tensors["response_mask"]).item(),
            "actor/bypass_mode": 1.0}


def bypass_correction(log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor,
                      settings: dict) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
    """Bypass mode's correction on one micro-batch, as verl's bypass-mode loss forms it: the IS
    weights and the rejection of the residual ratio ``pi_theta / pi_rollout`` (``log_prob``
    detached) with ``settings``' ``rollout_is`` / ``rollout_rs`` (:data:`BYPASS_RS_KEY`).

    Args:
        log_prob, rollout_log_prob, response_mask: ``[b, R]``.

    Returns:
        ``(weights [b, R] or None, response_mask [b, R] without the rejected tokens, rollout_corr/*
        metrics)``. Only ``loss_type=reinforce`` applies the weights; with ``ppo_clip`` the ratio
        already is ``pi_theta / pi_rollout`` and they are statistics only (verl does the same).
    """
    with torch.no_grad():
        return compute_rollout_correction_and_rejection_mask(
            log_prob.detach(), rollout_log_prob, response_mask, rollout_is=settings["rollout_is"],
            rollout_is_threshold=settings["rollout_is_threshold"],
            rollout_is_batch_normalize=settings["rollout_is_batch_normalize"], rollout_rs=settings["rollout_rs"],
            rollout_rs_threshold=settings["rollout_rs_threshold"],
            rollout_rs_threshold_lower=settings["rollout_rs_threshold_lower"])


def bypass_metric_names(settings: dict) -> list[str]:
    """The ``rollout_corr/*`` names :func:`bypass_correction` returns for ``settings`` (sorted)."""
    zeros = torch.zeros(1, 2)
    return sorted(bypass_correction(zeros, zeros, torch.ones(1, 2), settings)[2])


def compute_policy_loss_reinforce(rollout_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                                  response_mask: torch.Tensor, loss_agg_mode: str = "seq-mean-token-sum",
                                  config=None, rollout_is_weights: torch.Tensor | None = None
                                  ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """REINFORCE with explicit IS weights: ``-A * log pi_theta * w`` per token (``w`` detached,
    1 without weights), aggregated with ``loss_agg_mode`` (verl's bypass-mode loss of
    ``rollout_correction.loss_type=reinforce``; Williams 1992).

    Args:
        rollout_log_prob, log_prob, advantages, response_mask: ``[B, R]``.
        config: the actor section (its ``global_batch_info`` reaches :func:`agg_loss`).
        rollout_is_weights: ``[B, R]`` IS weights of ``pi_theta / pi_rollout``, or None.

    Returns:
        ``(loss, {"pg_loss", "pg_clipfrac" (0: nothing is clipped), "ppo_kl" (mean log pi_rollout -
        log pi_theta)})``.
    """
    from rlvr.trainer.ppo.policy_loss import agg_loss

    pg_losses = -advantages * log_prob
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    batch_info = dict(config.global_batch_info) if config is not None else {}
    loss = agg_loss(pg_losses, response_mask, loss_agg_mode, **batch_info)
    kl = masked_mean(rollout_log_prob - log_prob.detach(), response_mask)
    return loss, {"pg_loss": loss.detach(), "pg_clipfrac": torch.zeros(()), "ppo_kl": kl}


def prox_from_update_settings(rollout_corr_config) -> dict:
    """The ``meta_info[PROX_FROM_UPDATE_KEY]`` of a batch whose proximal log-probs come from the update.

    Decoupled PPO with one optimizer step per batch (``ppo_epochs=1``, one mini-batch): the proximal
    policy is the actor's weights at the start of the update, so the update's own forward pass,
    detached, gives exactly the log-probs a separate ``compute_log_prob`` call would (up to float
    rounding), and that call is skipped. The IS weights of the proximal/behaviour ratio are then formed
    per micro-batch (:class:`ProxFromUpdate`); every ratio level is per row, so they equal
    the driver's. Rejection (``rollout_rs``) changes ``response_mask`` before the advantages and is
    refused with this mode by the config checks.
    """
    rc = rollout_corr_config
    if rc.rollout_rs is not None or rc.bypass_mode:
        raise ValueError("proximal log-probs from the update support rollout_is only (no rollout_rs, no bypass_mode)")
    return {"rollout_is": rc.rollout_is, "rollout_is_threshold": float(rc.rollout_is_threshold),
            "log_prob_diff_threshold": float(rc.log_prob_diff_threshold)}


class ProxFromUpdate:
    """One update's proximal log-probs taken from its own forward pass (one optimizer step).

    The actor calls :meth:`micro_batch` with every micro-batch's forward pass, which gives the PPO
    loss its ``old_log_prob`` (that pass, detached) and IS weights of the proximal/behaviour ratio,
    and keeps what :meth:`metrics` needs; after the update :meth:`metrics` gives, over the rows of the
    whole batch, what the trainer's ``old_log_prob`` stage would have reported. Every ratio level is
    per row, so weights formed per micro-batch equal the driver's on the whole batch.

    Args:
        settings: :func:`prox_from_update_settings` (``meta_info[PROX_FROM_UPDATE_KEY]``).
    """

    def __init__(self, settings: dict):
        self.settings = settings
        self._parts: list[tuple[torch.Tensor, ...]] = []

    def micro_batch(self, log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One micro-batch: ``log_prob`` ``[b, R]`` is the update's forward pass (with its gradient),
        ``rollout_log_prob`` ``[b, R]`` the behaviour policy's (the rollout engine's).

        Returns:
            ``(old_log_prob [b, R] = log_prob detached, rollout_is_weights [b, R] or None)``.
        """
        old = log_prob.detach()
        part = (old.cpu(), rollout_log_prob.cpu(), response_mask.cpu())
        weights = None
        if self.settings["rollout_is"] is not None:
            raw, weights = _truncated_is(old.float() - rollout_log_prob.float(), response_mask,
                                         self.settings["rollout_is"], self.settings["rollout_is_threshold"])
            part += (raw.cpu(), weights.cpu())
        self._parts.append(part)
        return old, weights

    def metrics(self) -> dict[str, float]:
        """The rollout/actor mismatch metrics, the IS weights' ``rollout_corr/*`` and
        ``actor/prox_from_update`` = 1, over every micro-batch seen (none seen: ``{}``)."""
        if not self._parts:
            return {}
        old, rollout, mask, *is_parts = (torch.cat(parts) for parts in zip(*self._parts))
        metrics = compute_rollout_mismatch_metrics(old, rollout, mask, self.settings["log_prob_diff_threshold"])
        if is_parts:
            raw, weights = is_parts
            is_metrics = _truncated_is_metrics(raw, weights, mask, self.settings["rollout_is_threshold"])
            metrics.update({f"rollout_corr/{name}": value for name, value in is_metrics.items()})
        return {**metrics, "actor/prox_from_update": 1.0}
