"""Policy losses: loss aggregation, clipped PPO and the policy-loss registry.

Registry convention (verl 0.9's signature, one for every entry)::

    fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
       config=None, rollout_is_weights=None) -> (loss, metrics)

``config`` is the actor config section (the schema's
:class:`~rlvr.trainer.config.schema.ActorConfig` or its OmegaConf node; None = the schema's
defaults): the clip ratios every clipping loss shares are its fields (``clip_ratio``,
``clip_ratio_low``, ``clip_ratio_high``, ``clip_ratio_c``), the loss-specific knobs live in its
``policy_loss`` subsection, and ``global_batch_info`` is passed on to :func:`agg_loss`.
``rollout_is_weights`` (``[batch, response_len]``, no gradient) are importance weights from an
off-policy correction; each loss multiplies its per-token losses by them before aggregating.

``loss`` is a 0-dim float32 tensor that carries the gradient; ``metrics`` is a dict with the keys
``pg_loss``, ``pg_clipfrac``, ``ppo_kl``, ``pg_clipfrac_lower``, each a detached 0-dim float32
tensor (callers call ``.item()`` when they log, so no device sync happens inside the loss).
All inputs are ``[batch, response_len]``; bf16/fp16 inputs are computed in float32. Every loss
aggregates with the ``loss_agg_mode`` it is given (verl's gspo and geo_mean always take the mean
over sequences: pass ``"seq-mean-token-mean"`` for their numbers).

Every loss clamps the log-ratio ``log_prob - old_log_prob`` to ``[-20, 20]`` before ``exp`` so
that ``exp`` can never overflow to ``inf`` (and the gradient to NaN) on a wildly off-policy token.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from rlvr.trainer.config.schema import AGG_LOSS_MODES, ActorConfig
from rlvr.utils.config_view import config_view
from rlvr.utils.errors import ConfigAssertionError
from rlvr.utils.registry import Registry
from rlvr.utils.torch_functional import masked_mean

LOG_RATIO_CLAMP = 20.0

PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]
POLICY_LOSS_REGISTRY: Registry[PolicyLossFn] = Registry("policy loss", verl_miss="Unsupported loss mode: {name}")


def _global_count(count: torch.Tensor | int | float | None, local: torch.Tensor, dp_size: int,
                  name: str) -> torch.Tensor | int | float:
    """The global normaliser, or the local one (at least 1) on a single rank."""
    if count is not None:
        return count
    if dp_size > 1:
        raise ValueError(f"agg_loss: {name} (over the whole data-parallel batch) is required when dp_size > 1")
    return local.clamp(min=1.0)


def agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_agg_mode: str, dp_size: int = 1,
             batch_num_tokens: int | torch.Tensor | None = None, global_batch_size: int | torch.Tensor | None = None,
             loss_scale_factor: int | float | None = None) -> torch.Tensor:
    """Aggregate a per-token loss matrix into a scalar.

    Modes (``L`` = ``loss_mat``, ``M`` = ``loss_mask``, ``R`` = ``loss_mask.shape[-1]``):

    - ``"token-mean"``: ``sum(L*M) / sum(M)`` (DAPO, Yu et al. 2025; every token weighs the same).
    - ``"token-sum"``: ``sum(L*M)``.
    - ``"seq-mean-token-sum"``: mean over sequences of ``sum_t L*M``.
    - ``"seq-mean-token-mean"``: mean over sequences of ``sum_t L*M / sum_t M`` (original GRPO).
    - ``"seq-mean-token-sum-norm"``: mean over sequences of ``sum_t L*M / R`` (Dr.GRPO, Liu et al.
      2025: a constant length normaliser, so long answers are not down-weighted); ``R`` is
      ``loss_scale_factor`` when given, else the mask's padded response length.

    Data parallelism (verl 0.9): with ``dp_size`` ranks each holding part of the batch, pass the
    counts over the whole batch, ``batch_num_tokens`` (valid tokens, for ``token-mean``) and
    ``global_batch_size`` (sequences, for the ``seq-mean-*`` modes); the local sum is divided by them
    and multiplied by ``dp_size``, so that the gradient averaged over ranks (DDP/FSDP) is the
    gradient of the whole batch's loss. ``token-sum`` is multiplied by ``dp_size`` for the same
    reason. With ``dp_size=1`` and no counts, the counts are the local ones: verl's three-argument
    form ``agg_loss(loss_mat, loss_mask, loss_agg_mode)`` keeps its meaning.

    The local sequence count is the number of sequences with at least one valid token: a fully
    masked row (padding added to balance a micro-batch) neither produces NaN nor dilutes the mean.
    If nothing is valid the result is 0 (still connected to the graph). Masked positions never leak
    into the result, even if they hold ``nan``/``inf``.

    Args:
        loss_mat: ``[batch, response_len]`` per-token losses.
        loss_mask: ``[batch, response_len]`` 1 on the tokens that count.
        loss_agg_mode: one of ``AGG_LOSS_MODES``.
        dp_size: data-parallel ranks the batch is split over.
        batch_num_tokens: valid tokens of the whole batch (needed for ``token-mean`` when ``dp_size > 1``).
        global_batch_size: sequences of the whole batch (needed for ``seq-mean-*`` when ``dp_size > 1``).
        loss_scale_factor: the constant ``R`` of ``seq-mean-token-sum-norm``.

    Returns:
        0-dim float32 tensor (bf16/fp16 losses are aggregated in float32).

    Raises:
        ValueError: unknown mode (lists the valid ones), or a global count missing with ``dp_size > 1``.
    """
    if loss_agg_mode not in AGG_LOSS_MODES:
        raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; valid modes: {', '.join(AGG_LOSS_MODES)}")
    mask = loss_mask.float()
    masked = torch.where(mask > 0, loss_mat.float() * mask, torch.zeros((), device=loss_mat.device))
    if loss_agg_mode == "token-sum":
        return masked.sum() * dp_size
    if loss_agg_mode == "token-mean":
        return masked.sum() / _global_count(batch_num_tokens, mask.sum(), dp_size, "batch_num_tokens") * dp_size
    token_count = mask.sum(dim=-1)
    seq_loss = masked.sum(dim=-1)
    if loss_agg_mode == "seq-mean-token-mean":
        seq_loss = seq_loss / token_count.clamp(min=1.0)
    valid_seq = (token_count > 0).float()
    sequences = _global_count(global_batch_size, valid_seq.sum(), dp_size, "global_batch_size")
    loss = (seq_loss * valid_seq).sum() / sequences * dp_size
    if loss_agg_mode == "seq-mean-token-sum-norm":
        loss = loss / (loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor)
    return loss


def _actor(config: Any) -> Any:
    """The actor section read with the schema's defaults for what ``config`` lacks (a verl
    ``ActorConfig``, a dict or a namespace with verl's keys only)."""
    return config_view(config, ActorConfig)


def _clip_range(config: Any) -> tuple[float, float]:
    """``(low, high)`` clip epsilons: ``clip_ratio_low/high``, each defaulting to ``clip_ratio``."""
    low = config.clip_ratio if config.clip_ratio_low is None else config.clip_ratio_low
    high = config.clip_ratio if config.clip_ratio_high is None else config.clip_ratio_high
    return low, high


def _aggregate(pg_losses: torch.Tensor, response_mask: torch.Tensor, loss_agg_mode: str, config: Any,
               rollout_is_weights: torch.Tensor | None) -> torch.Tensor:
    """Weight the per-token losses by the off-policy correction, then :func:`agg_loss` them."""
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights.detach().float()
    return agg_loss(pg_losses, response_mask, loss_agg_mode, **config.global_batch_info)


def _metrics(pg_loss: torch.Tensor, clipfrac: torch.Tensor, ppo_kl: torch.Tensor,
             clipfrac_lower: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"pg_loss": pg_loss.detach(), "pg_clipfrac": clipfrac.detach(), "ppo_kl": ppo_kl.detach(),
            "pg_clipfrac_lower": clipfrac_lower.detach()}


def _as_float(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.float() for t in tensors]


def _log_ratio(old_log_prob: torch.Tensor, log_prob: torch.Tensor) -> torch.Tensor:
    return (log_prob - old_log_prob).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def _zero(like: torch.Tensor) -> torch.Tensor:
    return torch.zeros((), dtype=torch.float32, device=like.device)


def _dual_clip_ppo(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                   clip_low: float, clip_high: float, clip_ratio_c: float):
    """Per-token dual-clip PPO losses (float32) and the masks of the clipped / dual-clipped tokens.

    Returns ``(pg_losses, log_ratio, clipped, dual_clipped)``, all ``[batch, response_len]``.
    """
    if clip_ratio_c <= 1.0:
        raise ConfigAssertionError("actor_rollout_ref.actor.clip_ratio_c",
                                   f"the dual-clip bound must be > 1 (typically 3), got {clip_ratio_c}")
    old_log_prob, log_prob, advantages = _as_float(old_log_prob, log_prob, advantages)
    log_ratio = _log_ratio(old_log_prob, log_prob)
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
        ValueError: no clip range given; ``ConfigAssertionError`` (also an ``AssertionError``, as
        verl asserts) for ``clip_ratio_c <= 1``.
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
    """Decorator registering a policy loss under ``name`` (another function under a taken name
    raises ``ValueError``; the same function again, or one with its module and qualified name,
    is accepted)."""
    return POLICY_LOSS_REGISTRY.register(name)


def get_policy_loss_fn(name: str) -> PolicyLossFn:
    """The policy loss registered as ``name`` (or at the object path ``pkg.module:fn``); a miss raises
    :class:`~rlvr.utils.registry.RegistryKeyError` (a ``KeyError`` and ``ValueError``) listing the valid names."""
    return POLICY_LOSS_REGISTRY[name]


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                                config=None, rollout_is_weights=None):
    """Clipped PPO with dual-clip (``compute_policy_loss``) in the registry convention, with the
    clip ratios of the actor section ``config``."""
    config = _actor(config)
    pg_losses, log_ratio, clipped, dual_clipped = _dual_clip_ppo(
        old_log_prob, log_prob, advantages, *_clip_range(config), config.clip_ratio_c)
    pg_loss = _aggregate(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    return pg_loss, _metrics(pg_loss, masked_mean(clipped.float(), response_mask),
                             masked_mean(-log_ratio, response_mask), masked_mean(dual_clipped.float(), response_mask))


@register_policy_loss("gspo")
def compute_policy_loss_gspo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="seq-mean-token-mean",
                             config=None, rollout_is_weights=None):
    """GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv:2507.18071).

    The sequence ratio is the geometric mean of the token ratios, ``s_i = exp(mean_t log r_t)``,
    clipped to ``[1 - clip_ratio_low, 1 + clip_ratio_high]`` (the paper uses 3e-4 and 4e-4: preset
    ``gspo``). GSPO-token form: per token the ratio is
    ``exp(log_prob - sg(log_prob) + sg(log s_i))`` so its value is ``s_i`` and its gradient is
    ``s_i * grad log_prob``; with ``loss_agg_mode="seq-mean-token-mean"`` this is exactly the paper's
    objective. Metrics: ``pg_clipfrac`` = tokens whose sequence ratio is clipped; ``pg_clipfrac_lower`` = 0.
    """
    config = _actor(config)
    low, high = _clip_range(config)
    old_log_prob, log_prob, advantages = _as_float(old_log_prob, log_prob, advantages)
    mask = response_mask.float()
    log_ratio = _log_ratio(old_log_prob, log_prob)
    seq_log_ratio = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    token_log_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    ratio = torch.exp(token_log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * ratio.clamp(1.0 - low, 1.0 + high)
    pg_losses = torch.maximum(loss_unclipped, loss_clipped)
    pg_loss = _aggregate(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    clipfrac = masked_mean((loss_clipped > loss_unclipped).float(), response_mask)
    return pg_loss, _metrics(pg_loss, clipfrac, masked_mean(-log_ratio, response_mask), _zero(log_ratio))


@register_policy_loss("gpg")
def compute_policy_loss_gpg(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                            config=None, rollout_is_weights=None):
    """GPG (Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline for Model
    Reasoning", arXiv:2504.02546): plain policy gradient ``loss = -A * log_prob`` (no ratio, no
    clip). Pair it with the ``gpg`` advantage estimator. Metrics: clip fractions are 0."""
    config = _actor(config)
    old_log_prob, log_prob, advantages = _as_float(old_log_prob, log_prob, advantages)
    pg_loss = _aggregate(-advantages * log_prob, response_mask, loss_agg_mode, config, rollout_is_weights)
    ppo_kl = masked_mean(-_log_ratio(old_log_prob, log_prob), response_mask)
    return pg_loss, _metrics(pg_loss, _zero(log_prob), ppo_kl, _zero(log_prob))


@register_policy_loss("cispo")
def compute_policy_loss_cispo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                              config=None, rollout_is_weights=None):
    """CISPO (MiniMax 2025, "MiniMax-M1", arXiv:2506.13585): clip the importance-sampling weight,
    not the token update: ``loss = -sg(clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high)) * A *
    log_prob``, so every token keeps a gradient (set ``clip_ratio_low=1`` for no lower bound, as
    the paper). Metrics: ``pg_clipfrac`` = tokens whose weight was clipped on either side;
    ``pg_clipfrac_lower`` = those clipped at the lower bound (verl reports 0)."""
    config = _actor(config)
    old_log_prob, log_prob, advantages = _as_float(old_log_prob, log_prob, advantages)
    log_ratio = _log_ratio(old_log_prob, log_prob)
    ratio = torch.exp(log_ratio)
    low, high = _clip_range(config)
    weight = ratio.clamp(1.0 - low, 1.0 + high).detach()
    pg_loss = _aggregate(-weight * advantages * log_prob, response_mask, loss_agg_mode, config, rollout_is_weights)
    return pg_loss, _metrics(pg_loss, masked_mean((ratio != weight).float(), response_mask),
                             masked_mean(-log_ratio, response_mask),
                             masked_mean((ratio < 1.0 - low).float(), response_mask))


def _token_covariance(advantages: torch.Tensor, log_prob: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Centered product ``(A - mean A) * (logp - mean logp)`` per token, means over valid tokens
    (Cui et al. 2025, eq. for Cov(log pi, A)); detached, ``[batch, response_len]``."""
    count = valid.sum().clamp(min=1)
    adv, logp = advantages.detach(), log_prob.detach()
    adv_mean = (adv * valid).sum() / count
    logp_mean = (logp * valid).sum() / count
    return (adv - adv_mean) * (logp - logp_mean)


def _positive_ratio(value: float, field: str) -> float:
    """A ``policy_loss`` fraction of tokens, checked to be > 0 (verl asserts it)."""
    if value <= 0:
        raise ConfigAssertionError(f"actor_rollout_ref.actor.policy_loss.{field}",
                                   f"must be > 0 (a fraction of the valid tokens, e.g. 0.0002), got {value}")
    return value


@register_policy_loss("clip_cov")
def compute_policy_loss_clip_cov(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                                 config=None, rollout_is_weights=None):
    """Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning
    Language Models", arXiv:2505.22617).

    Base loss: clipped PPO ``max(-A r, -A clip(r, 1-low, 1+high))`` (no dual-clip). Among valid tokens
    not already clipped whose covariance ``(A - mean A)(logp - mean logp)`` lies strictly inside
    ``(policy_loss.clip_cov_lb, clip_cov_ub)``, ``max(1, int(clip_cov_ratio * n_valid))`` are drawn
    uniformly at random (``torch.randperm`` on the global RNG, so ``set_seed`` makes it
    reproducible) and take no part in the loss (value and gradient 0, as verl).
    ``pg_clipfrac`` = fraction of those tokens.
    """
    config = _actor(config)
    ratio_of_tokens = _positive_ratio(config.policy_loss.clip_cov_ratio, "clip_cov_ratio")
    old_log_prob, log_prob, advantages = _as_float(old_log_prob, log_prob, advantages)
    valid = response_mask > 0
    low, high = _clip_range(config)
    log_ratio = _log_ratio(old_log_prob, log_prob)
    ratio = torch.exp(log_ratio)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * ratio.clamp(1.0 - low, 1.0 + high)
    cov = _token_covariance(advantages, log_prob, valid.float())
    bounds = config.policy_loss
    candidates = valid & ~(loss_clipped > loss_unclipped) & (cov > bounds.clip_cov_lb) & (cov < bounds.clip_cov_ub)
    candidate_idx = candidates.flatten().nonzero().squeeze(-1)
    n_cut = min(max(int(ratio_of_tokens * int(valid.sum())), 1), candidate_idx.numel())
    chosen = candidate_idx[torch.randperm(candidate_idx.numel(), device=candidate_idx.device)[:n_cut]]
    cut = torch.zeros(loss_clipped.numel(), dtype=torch.bool, device=loss_clipped.device)
    cut[chosen] = True
    cut = cut.view_as(loss_clipped)
    pg_losses = torch.maximum(loss_unclipped, loss_clipped).masked_fill(cut, 0.0)
    pg_loss = _aggregate(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    return pg_loss, _metrics(pg_loss, masked_mean(cut.float(), response_mask),
                             masked_mean(-log_ratio, response_mask), _zero(log_ratio))


@register_policy_loss("kl_cov")
def compute_policy_loss_kl_cov(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                               config=None, rollout_is_weights=None):
    """KL-Cov (Cui et al. 2025, arXiv:2505.22617): no ratio clipping; the
    ``max(1, int(policy_loss.kl_cov_ratio * n_valid))`` valid tokens with the largest covariance
    ``(A - mean A)(logp - mean logp)`` get the loss ``-A r + policy_loss.ppo_kl_coef * |log r|``,
    all others ``-A r``. ``pg_clipfrac`` = fraction of penalised tokens (verl reports 0); ``ppo_kl``
    is ``mean(old - new)`` as for every loss (verl reports ``mean |log r|`` here)."""
    config = _actor(config)
    ratio_of_tokens = _positive_ratio(config.policy_loss.kl_cov_ratio, "kl_cov_ratio")
    old_log_prob, log_prob, advantages = _as_float(old_log_prob, log_prob, advantages)
    valid = response_mask > 0
    log_ratio = _log_ratio(old_log_prob, log_prob)
    pg_losses = -advantages * torch.exp(log_ratio)
    valid_idx = valid.flatten().nonzero().squeeze(-1)
    penalised = torch.zeros(pg_losses.numel(), dtype=torch.bool, device=pg_losses.device)
    if valid_idx.numel() > 0:
        cov = _token_covariance(advantages, log_prob, valid.float()).flatten()[valid_idx]
        k = min(max(int(valid_idx.numel() * ratio_of_tokens), 1), valid_idx.numel())
        penalised[valid_idx[torch.topk(cov, k).indices]] = True
    penalised = penalised.view_as(pg_losses)
    pg_losses = torch.where(penalised, pg_losses + config.policy_loss.ppo_kl_coef * log_ratio.abs(), pg_losses)
    pg_loss = _aggregate(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    return pg_loss, _metrics(pg_loss, masked_mean(penalised.float(), response_mask),
                             masked_mean(-log_ratio, response_mask), _zero(log_ratio))


@register_policy_loss("geo_mean")
def compute_policy_loss_geo_mean(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                                 config=None, rollout_is_weights=None):
    """GMPO (Zhao et al. 2025, "Geometric-Mean Policy Optimization", arXiv:2507.20673).

    Per token, the log-ratio is clipped in log space to ``[-clip_ratio_low, clip_ratio_high]``
    (the paper uses 0.4) pessimistically (``sgn(A) * min(sgn(A) lr, sgn(A) clip(lr))``); the
    sequence ratio is the geometric mean ``exp(mean_t lr_clipped)`` and the sequence loss is
    ``-mean_t(A) * ratio``, times the geometric mean of the sequence's ``rollout_is_weights``. The
    sequence loss is broadcast over the sequence's tokens and aggregated with ``loss_agg_mode``
    (``"seq-mean-token-mean"`` gives the paper's and verl's mean over sequences). Metrics: clipped
    tokens with ``A > 0`` (``pg_clipfrac``) and ``A < 0`` (``pg_clipfrac_lower``).
    """
    config = _actor(config)
    low, high = _clip_range(config)
    old_log_prob, log_prob, advantages = _as_float(old_log_prob, log_prob, advantages)
    mask = response_mask.float()
    length = mask.sum(-1).clamp(min=1.0)
    log_ratio = _log_ratio(old_log_prob, log_prob)
    clipped_lr = log_ratio.clamp(-low, high)
    sign = torch.sign(advantages)
    pessimistic_lr = sign * torch.minimum(sign * log_ratio, sign * clipped_lr)
    seq_ratio = torch.exp((pessimistic_lr * mask).sum(-1) / length)
    seq_loss = -(advantages * mask).sum(-1) / length * seq_ratio
    if rollout_is_weights is not None:
        seq_loss = seq_loss * torch.exp((torch.log(rollout_is_weights.float() + 1e-10) * mask).sum(-1) / length)
    pg_loss = _aggregate(seq_loss.unsqueeze(-1).expand_as(log_ratio), response_mask, loss_agg_mode, config, None)
    clipped = log_ratio != clipped_lr
    return pg_loss, _metrics(pg_loss, masked_mean((clipped & (advantages > 0)).float(), response_mask),
                             masked_mean(-log_ratio, response_mask),
                             masked_mean((clipped & (advantages < 0)).float(), response_mask))


# The losses of these modules register with the ones above whenever the registry is imported (they
# import this module's helpers, so they come last): dppo_tv, dppo_kl, sapo, dro; bypass_mode.
from rlvr.trainer.ppo import bypass_loss, trust_region_losses  # noqa: E402,F401
