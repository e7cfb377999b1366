"""Policy losses: loss aggregation, clipped PPO and the policy-loss registry.

Registry convention (one signature for every entry)::

    fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
       config=None, rollout_is_weights=None) -> (loss, metrics)

``loss`` is a 0-dim float32 tensor that carries the gradient; ``metrics`` is a dict with the keys
``pg_loss``, ``pg_clipfrac``, ``ppo_kl``, ``pg_clipfrac_lower``, each a detached 0-dim float32
tensor (callers call ``.item()`` when they log, so no device sync happens inside the loss).
All inputs are ``[batch, response_len]``; bf16/fp16 inputs are computed in float32.
``rollout_is_weights`` (optional, no gradient) multiplies the per-token losses before aggregation:
the off-policy correction of :mod:`rlvr.trainer.ppo.rollout_correction`, applied as verl does.

Every loss clamps the log-ratio ``log_prob - old_log_prob`` to ``[-20, 20]`` before ``exp`` so
that ``exp`` can never overflow to ``inf`` (and the gradient to NaN) on a wildly off-policy token.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from rlvr.utils.registry import Registry
from rlvr.utils.torch_functional import masked_mean

LOG_RATIO_CLAMP = 20.0
AGG_LOSS_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")

PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]
POLICY_LOSS_REGISTRY: Registry[PolicyLossFn] = Registry("policy loss")


@dataclass
class PolicyLossConfig:
    """Parameters of the policy losses (``actor.policy_loss`` + the actor's clip ratios)."""

    clip_ratio: float = field(default=0.2, metadata={"help": "PPO clip epsilon (both sides unless low/high set)"})
    clip_ratio_low: float | None = field(default=None, metadata={"help": "lower clip epsilon; None = clip_ratio"})
    clip_ratio_high: float | None = field(
        default=None, metadata={"help": "upper clip epsilon (DAPO clip-higher); None = clip_ratio"})
    clip_ratio_c: float = field(default=3.0, metadata={"help": "dual-clip bound for negative advantages (> 1)"})
    gspo_clip_ratio_low: float = field(default=3e-4, metadata={"help": "GSPO lower clip of the sequence ratio"})
    gspo_clip_ratio_high: float = field(default=4e-4, metadata={"help": "GSPO upper clip of the sequence ratio"})
    cispo_clip_ratio_low: float = field(
        default=1.0, metadata={"help": "CISPO lower clip of the IS weight (1.0 = no lower bound)"})
    cispo_clip_ratio_high: float = field(default=0.2, metadata={"help": "CISPO upper clip of the IS weight"})
    clip_cov_ratio: float = field(
        default=2e-4, metadata={"help": "Clip-Cov: fraction of valid tokens whose gradient is detached"})
    clip_cov_lb: float = field(default=1.0, metadata={"help": "Clip-Cov: lower covariance bound of candidates"})
    clip_cov_ub: float = field(default=5.0, metadata={"help": "Clip-Cov: upper covariance bound of candidates"})
    kl_cov_ratio: float = field(
        default=2e-4, metadata={"help": "KL-Cov: fraction of valid tokens that get the KL penalty"})
    kl_cov_coef: float = field(default=1.0, metadata={"help": "KL-Cov: coefficient of the |log-ratio| penalty"})
    geo_mean_clip_ratio_low: float = field(
        default=0.4, metadata={"help": "GMPO lower clip of the token log-ratio"})
    geo_mean_clip_ratio_high: float = field(
        default=0.4, metadata={"help": "GMPO upper clip of the token log-ratio"})

    def clip_low(self) -> float:
        return self.clip_ratio if self.clip_ratio_low is None else self.clip_ratio_low

    def clip_high(self) -> float:
        return self.clip_ratio if self.clip_ratio_high is None else self.clip_ratio_high


def agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_agg_mode: str) -> torch.Tensor:
    """Aggregate a per-token loss matrix into a scalar.

    Modes (``L`` = ``loss_mat``, ``M`` = ``loss_mask``, ``R`` = ``loss_mask.shape[-1]``):

    - ``"token-mean"``: ``sum(L*M) / sum(M)`` (DAPO, Yu et al. 2025; every token weighs the same).
    - ``"seq-mean-token-sum"``: mean over sequences of ``sum_t L*M``.
    - ``"seq-mean-token-mean"``: mean over sequences of ``sum_t L*M / sum_t M`` (original GRPO).
    - ``"seq-mean-token-sum-norm"``: mean over sequences of ``sum_t L*M / R`` (Dr.GRPO, Liu et al.
      2025: a constant length normaliser, the mask's padded response length ``R``, so that long
      answers are not down-weighted). verl divides the *batch* total by ``R`` without the mean over
      sequences; we follow the paper (``1/G`` over the group) so the scale does not grow with the
      batch size.

    The sequence means run over the sequences with at least one valid token: a fully masked row
    (padding added to balance a micro-batch) neither produces NaN nor dilutes the mean. If nothing
    is valid the result is 0 (still connected to the graph). Masked positions never leak into the
    result, even if they hold ``nan``/``inf``.

    Args:
        loss_mat: ``[batch, response_len]`` per-token losses.
        loss_mask: ``[batch, response_len]`` 1 on the tokens that count.
        loss_agg_mode: one of ``AGG_LOSS_MODES``.

    Returns:
        0-dim float32 tensor (bf16/fp16 losses are aggregated in float32).

    Raises:
        ValueError: unknown mode (lists the valid ones).
    """
    loss_mat = loss_mat.float()
    mask = loss_mask.float()
    masked = torch.where(mask > 0, loss_mat * mask, torch.zeros((), device=loss_mat.device))
    if loss_agg_mode == "token-mean":
        return masked.sum() / mask.sum().clamp(min=1.0)
    if loss_agg_mode not in AGG_LOSS_MODES:
        raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; valid modes: {', '.join(AGG_LOSS_MODES)}")
    token_count = mask.sum(dim=-1)
    seq_loss = masked.sum(dim=-1)
    if loss_agg_mode == "seq-mean-token-mean":
        seq_loss = seq_loss / token_count.clamp(min=1.0)
    elif loss_agg_mode == "seq-mean-token-sum-norm":
        seq_loss = seq_loss / loss_mask.shape[-1]
    valid_seq = (token_count > 0).float()
    return (seq_loss * valid_seq).sum() / valid_seq.sum().clamp(min=1.0)


def _metrics(pg_loss: torch.Tensor, clipfrac: torch.Tensor, ppo_kl: torch.Tensor,
             clipfrac_lower: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"pg_loss": pg_loss.detach(), "pg_clipfrac": clipfrac.detach(), "ppo_kl": ppo_kl.detach(),
            "pg_clipfrac_lower": clipfrac_lower.detach()}


def _as_float(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.float() for t in tensors]


def _apply_rollout_is_weights(loss_mat: torch.Tensor, rollout_is_weights: torch.Tensor | None) -> torch.Tensor:
    """``loss_mat * rollout_is_weights`` (the rollout correction's weights, ``[batch, response_len]``,
    no gradient); unchanged when there are none."""
    return loss_mat if rollout_is_weights is None else loss_mat * rollout_is_weights.detach().float()


def _dual_clip_ppo(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                   clip_low: float, clip_high: float, clip_ratio_c: float):
    """Per-token dual-clip PPO losses (float32) and the masks of the clipped / dual-clipped tokens.

    Returns ``(pg_losses, log_ratio, clipped, dual_clipped)``, all ``[batch, response_len]``.
    """
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 for dual-clip PPO, got {clip_ratio_c}")
    old_log_prob, log_prob, advantages = _as_float(old_log_prob, log_prob, advantages)
    log_ratio = (log_prob - old_log_prob).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss_ppo = torch.maximum(loss_unclipped, loss_clipped)
    loss_dual = -advantages * clip_ratio_c
    negative = advantages < 0
    pg_losses = torch.where(negative, torch.minimum(loss_ppo, loss_dual), loss_ppo)
    return pg_losses, log_ratio, loss_clipped > loss_unclipped, (loss_ppo > loss_dual) & negative


def compute_policy_loss(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                        response_mask: torch.Tensor, cliprange: float | None = None,
                        cliprange_low: float | None = None, cliprange_high: float | None = None,
                        clip_ratio_c: float = 3.0, loss_agg_mode: str = "token-mean"):
    """Clipped PPO surrogate with asymmetric clip and dual-clip.

    PPO: Schulman et al. 2017 (arXiv:1707.06347); clip-higher: DAPO, Yu et al. 2025; dual-clip:
    Ye et al. 2020 (arXiv:1912.09729). With ``ratio = exp(clamp(log_prob - old_log_prob, -20, 20))``::

        l1 = -A * ratio;  l2 = -A * clip(ratio, 1 - cliprange_low, 1 + cliprange_high)
        l  = max(l1, l2)                          if A >= 0
        l  = min(max(l1, l2), -A * clip_ratio_c)  if A < 0   (dual-clip)

    Args:
        old_log_prob: ``[batch, response_len]`` log-probs under the behaviour policy.
        log_prob: ``[batch, response_len]`` log-probs under the current policy.
        advantages: ``[batch, response_len]``.
        response_mask: ``[batch, response_len]``.
        cliprange: epsilon used for both sides when ``cliprange_low``/``cliprange_high`` are None.
        cliprange_low / cliprange_high: asymmetric epsilons.
        clip_ratio_c: dual-clip lower bound of the ratio for negative advantages; must be > 1.
        loss_agg_mode: see ``agg_loss``.

    Returns:
        ``(pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)``: the loss and, averaged over the
        mask, the fraction of tokens where the clipped term was active, the approximate KL
        ``mean(old - new)``, and the fraction where the dual-clip bound was active.

    Raises:
        ValueError: no clip range given, or ``clip_ratio_c <= 1``.
    """
    cliprange_low = cliprange if cliprange_low is None else cliprange_low
    cliprange_high = cliprange if cliprange_high is None else cliprange_high
    if cliprange_low is None or cliprange_high is None:
        raise ValueError("compute_policy_loss needs cliprange, or both cliprange_low and cliprange_high")
    pg_losses, log_ratio, clipped, dual_clipped = _dual_clip_ppo(
        old_log_prob, log_prob, advantages, cliprange_low, cliprange_high, clip_ratio_c)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode)
    return (pg_loss, masked_mean(clipped.float(), response_mask), masked_mean(-log_ratio, response_mask),
            masked_mean(dual_clipped.float(), response_mask))


def register_policy_loss(name: str) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator registering a policy loss under ``name`` (a duplicate name raises ``ValueError``)."""
    return POLICY_LOSS_REGISTRY.register(name)


def get_policy_loss_fn(name: str) -> PolicyLossFn:
    """Return the policy loss registered as ``name``; a miss raises ``KeyError`` listing valid names."""
    return POLICY_LOSS_REGISTRY.get(name)


def _config(config: PolicyLossConfig | None) -> PolicyLossConfig:
    return PolicyLossConfig() if config is None else config


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                                config=None, rollout_is_weights=None):
    """Clipped PPO with dual-clip (``compute_policy_loss``) in the registry convention, with the
    clip ratios from ``config``, each token's loss weighted by ``rollout_is_weights`` when given."""
    config = _config(config)
    pg_losses, log_ratio, clipped, dual_clipped = _dual_clip_ppo(
        old_log_prob, log_prob, advantages, config.clip_low(), config.clip_high(), config.clip_ratio_c)
    pg_losses = _apply_rollout_is_weights(pg_losses, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode)
    return pg_loss, _metrics(pg_loss, masked_mean(clipped.float(), response_mask),
                             masked_mean(-log_ratio, response_mask), masked_mean(dual_clipped.float(), response_mask))


def _log_ratio(old_log_prob: torch.Tensor, log_prob: torch.Tensor) -> torch.Tensor:
    return (log_prob - old_log_prob).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def _zero(like: torch.Tensor) -> torch.Tensor:
    return torch.zeros((), dtype=torch.float32, device=like.device)


@register_policy_loss("gspo")
def compute_policy_loss_gspo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                             config=None, rollout_is_weights=None):
    """GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv:2507.18071).

    The sequence ratio is the geometric mean of the token ratios, ``s_i = exp(mean_t log r_t)``,
    clipped with ``gspo_clip_ratio_low/high``. GSPO-token form: per token the ratio is
    ``exp(log_prob - sg(log_prob) + sg(log s_i))`` so its value is ``s_i`` and its gradient is
    ``s_i * grad log_prob``; with ``loss_agg_mode="seq-mean-token-mean"`` this is exactly the paper's
    objective. verl forces that mode; we use the mode the caller passes (one rule for all losses).
    Metrics: ``pg_clipfrac`` = tokens whose sequence ratio is clipped; ``pg_clipfrac_lower`` = 0.
    """
    config = _config(config)
    old_log_prob, log_prob, advantages = _as_float(old_log_prob, log_prob, advantages)
    mask = response_mask.float()
    log_ratio = _log_ratio(old_log_prob, log_prob)
    seq_log_ratio = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    token_log_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    ratio = torch.exp(token_log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * ratio.clamp(1.0 - config.gspo_clip_ratio_low, 1.0 + config.gspo_clip_ratio_high)
    pg_losses = _apply_rollout_is_weights(torch.maximum(loss_unclipped, loss_clipped), rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode)
    clipfrac = masked_mean((loss_clipped > loss_unclipped).float(), response_mask)
    return pg_loss, _metrics(pg_loss, clipfrac, masked_mean(-log_ratio, response_mask), _zero(log_ratio))


@register_policy_loss("gpg")
def compute_policy_loss_gpg(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                            config=None, rollout_is_weights=None):
    """GPG (Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline for Model
    Reasoning", arXiv:2504.02546): plain policy gradient ``loss = -A * log_prob`` (no ratio, no
    clip). Pair it with the ``gpg`` advantage estimator. Metrics: clip fractions are 0."""
    config = _config(config)
    old_log_prob, log_prob, advantages = _as_float(old_log_prob, log_prob, advantages)
    pg_losses = _apply_rollout_is_weights(-advantages * log_prob, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode)
    ppo_kl = masked_mean(-_log_ratio(old_log_prob, log_prob), response_mask)
    return pg_loss, _metrics(pg_loss, _zero(log_prob), ppo_kl, _zero(log_prob))


@register_policy_loss("cispo")
def compute_policy_loss_cispo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                              config=None, rollout_is_weights=None):
    """CISPO (MiniMax 2025, "MiniMax-M1", arXiv:2506.13585): clip the importance-sampling weight,
    not the token update: ``loss = -sg(clip(r, 1 - cispo_clip_ratio_low, 1 + cispo_clip_ratio_high))
    * A * log_prob``, so every token keeps a gradient. Metrics: ``pg_clipfrac`` = tokens with
    ``r > 1 + high``; ``pg_clipfrac_lower`` = tokens with ``r < 1 - low``."""
    config = _config(config)
    old_log_prob, log_prob, advantages = _as_float(old_log_prob, log_prob, advantages)
    log_ratio = _log_ratio(old_log_prob, log_prob)
    ratio = torch.exp(log_ratio)
    low, high = 1.0 - config.cispo_clip_ratio_low, 1.0 + config.cispo_clip_ratio_high
    weight = ratio.clamp(low, high).detach()
    pg_losses = _apply_rollout_is_weights(-weight * advantages * log_prob, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode)
    return pg_loss, _metrics(pg_loss, masked_mean((ratio > high).float(), response_mask),
                             masked_mean(-log_ratio, response_mask), masked_mean((ratio < low).float(), response_mask))


def _token_covariance(advantages: torch.Tensor, log_prob: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Centered product ``(A - mean A) * (logp - mean logp)`` per token, means over valid tokens
    (Cui et al. 2025, eq. for Cov(log pi, A)); detached, ``[batch, response_len]``."""
    count = valid.sum().clamp(min=1)
    adv, logp = advantages.detach(), log_prob.detach()
    adv_mean = (adv * valid).sum() / count
    logp_mean = (logp * valid).sum() / count
    return (adv - adv_mean) * (logp - logp_mean)


@register_policy_loss("clip_cov")
def compute_policy_loss_clip_cov(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                                 config=None, rollout_is_weights=None):
    """Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning
    Language Models", arXiv:2505.22617).

    Base loss: clipped PPO ``max(-A r, -A clip(r, 1-low, 1+high))`` (no dual-clip). Among valid tokens
    not already clipped whose covariance ``(A - mean A)(logp - mean logp)`` lies strictly inside
    ``(clip_cov_lb, clip_cov_ub)``, ``max(1, int(clip_cov_ratio * n_valid))`` are drawn uniformly at
    random (``torch.randperm`` on the global RNG, so ``set_seed`` makes it reproducible) and their
    gradient is detached. We detach (value kept, as the paper says) where verl multiplies the loss by
    0 (value dropped); the gradient is identical. ``pg_clipfrac`` = fraction of detached tokens.
    """
    config = _config(config)
    old_log_prob, log_prob, advantages = _as_float(old_log_prob, log_prob, advantages)
    valid = response_mask > 0
    log_ratio = _log_ratio(old_log_prob, log_prob)
    ratio = torch.exp(log_ratio)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * ratio.clamp(1.0 - config.clip_low(), 1.0 + config.clip_high())
    pg_losses = torch.maximum(loss_unclipped, loss_clipped)
    cov = _token_covariance(advantages, log_prob, valid.float())
    candidates = valid & ~(loss_clipped > loss_unclipped) & (cov > config.clip_cov_lb) & (cov < config.clip_cov_ub)
    candidate_idx = candidates.flatten().nonzero().squeeze(-1)
    n_detach = min(max(int(config.clip_cov_ratio * int(valid.sum())), 1), candidate_idx.numel())
    chosen = candidate_idx[torch.randperm(candidate_idx.numel(), device=candidate_idx.device)[:n_detach]]
    detach = torch.zeros(pg_losses.numel(), dtype=torch.bool, device=pg_losses.device)
    detach[chosen] = True
    detach = detach.view_as(pg_losses)
    pg_losses = torch.where(detach, pg_losses.detach(), pg_losses)
    pg_losses = _apply_rollout_is_weights(pg_losses, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode)
    return pg_loss, _metrics(pg_loss, masked_mean(detach.float(), response_mask),
                             masked_mean(-log_ratio, response_mask), _zero(log_ratio))


@register_policy_loss("kl_cov")
def compute_policy_loss_kl_cov(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                               config=None, rollout_is_weights=None):
    """KL-Cov (Cui et al. 2025, arXiv:2505.22617): no ratio clipping; the
    ``max(1, int(kl_cov_ratio * n_valid))`` valid tokens with the largest covariance
    ``(A - mean A)(logp - mean logp)`` get the loss ``-A r + kl_cov_coef * |log r|``, all others
    ``-A r``. ``pg_clipfrac`` = fraction of penalised tokens (verl reports 0); ``ppo_kl`` is
    ``mean(old - new)`` as for every loss (verl reports ``mean |log r|`` here)."""
    config = _config(config)
    old_log_prob, log_prob, advantages = _as_float(old_log_prob, log_prob, advantages)
    valid = response_mask > 0
    log_ratio = _log_ratio(old_log_prob, log_prob)
    pg_losses = -advantages * torch.exp(log_ratio)
    n_valid = int(valid.sum())
    penalised = torch.zeros(pg_losses.numel(), dtype=torch.bool, device=pg_losses.device)
    if n_valid > 0:
        cov = _token_covariance(advantages, log_prob, valid.float()).flatten()
        cov = cov.masked_fill(~valid.flatten(), float("-inf"))
        k = min(max(int(n_valid * config.kl_cov_ratio), 1), n_valid)
        penalised[torch.topk(cov, k).indices] = True
    penalised = penalised.view_as(pg_losses)
    pg_losses = torch.where(penalised, pg_losses + config.kl_cov_coef * log_ratio.abs(), pg_losses)
    pg_losses = _apply_rollout_is_weights(pg_losses, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode)
    return pg_loss, _metrics(pg_loss, masked_mean(penalised.float(), response_mask),
                             masked_mean(-log_ratio, response_mask), _zero(log_ratio))


@register_policy_loss("geo_mean")
def compute_policy_loss_geo_mean(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                                 config=None, rollout_is_weights=None):
    """GMPO (Zhao et al. 2025, "Geometric-Mean Policy Optimization", arXiv:2507.20673).

    Per token, the log-ratio is clipped in log space to ``[-geo_mean_clip_ratio_low,
    geo_mean_clip_ratio_high]`` pessimistically (``sgn(A) * min(sgn(A) lr, sgn(A) clip(lr))``); the
    sequence ratio is the geometric mean ``exp(mean_t lr_clipped)`` and the sequence loss is
    ``-mean_t(A) * ratio``. The sequence loss is broadcast over the sequence's tokens and aggregated
    with ``loss_agg_mode`` (``"seq-mean-token-mean"`` reproduces the paper's mean over sequences;
    verl always takes the plain mean over sequences). Metrics: clipped tokens with ``A > 0``
    (``pg_clipfrac``) and ``A < 0`` (``pg_clipfrac_lower``).
    """
    config = _config(config)
    old_log_prob, log_prob, advantages = _as_float(old_log_prob, log_prob, advantages)
    mask = response_mask.float()
    length = mask.sum(-1).clamp(min=1.0)
    log_ratio = _log_ratio(old_log_prob, log_prob)
    clipped_lr = log_ratio.clamp(-config.geo_mean_clip_ratio_low, config.geo_mean_clip_ratio_high)
    sign = torch.sign(advantages)
    pessimistic_lr = sign * torch.minimum(sign * log_ratio, sign * clipped_lr)
    seq_ratio = torch.exp((pessimistic_lr * mask).sum(-1) / length)
    seq_adv = (advantages * mask).sum(-1) / length
    pg_losses = (-seq_adv * seq_ratio).unsqueeze(-1).expand_as(log_ratio)
    pg_losses = _apply_rollout_is_weights(pg_losses, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode)
    clipped = log_ratio != clipped_lr
    return pg_loss, _metrics(pg_loss, masked_mean((clipped & (advantages > 0)).float(), response_mask),
                             masked_mean(-log_ratio, response_mask),
                             masked_mean((clipped & (advantages < 0)).float(), response_mask))
