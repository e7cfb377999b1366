"""Advantage estimators and their registry.

One calling convention, so the trainer never names an estimator::

    advantages, returns = get_adv_estimator_fn(name)(
        token_level_rewards=..., response_mask=..., index=..., values=..., reward_baselines=...,
        old_log_prob=..., old_log_probs=..., rollout_log_prob=..., sum_pi_squared=...,
        rollout_is_weights=..., non_tensor_batch=..., batch=..., config=algorithm_section)

(``old_log_probs`` is ``old_log_prob`` again under the name verl's optimal-token-baseline estimators
use; ``non_tensor_batch`` / ``batch`` are the batch's fields, for GDPO's per-key rewards.)

``config`` is the run's ``algorithm`` config section (the schema's
:class:`~rlvr.trainer.config.schema.AlgorithmConfig` or its OmegaConf node; None = the schema's
defaults): every knob an estimator has (``gamma``, ``lam``, ``norm_adv_by_std_in_grpo``,
``singleton_advantage``, ``gpg_alpha_count``, ``egpo_*``) is read from it. The leading positional
parameters of each estimator follow verl 0.9's order, so a positional verl-style call gives verl's
numbers; every estimator takes what it needs and ignores the rest (``**kwargs``).

Shapes: ``token_level_rewards``, ``response_mask``, ``values``, ``old_log_prob``,
``rollout_log_prob``, ``sum_pi_squared``, ``rollout_is_weights`` are ``[batch, response_len]``; ``reward_baselines`` is ``[batch]``; ``index``
is a numpy object array ``[batch]`` with the uid of each row's prompt (rows of one prompt form a
group). Each estimator returns float32 ``(advantages, returns)``, both ``[batch, response_len]``
and zero outside the response mask; a needed input that is None raises a clear ``ValueError``.

A registry entry carries what the estimator needs from the trainer
(:class:`AdvantageEstimatorNeeds`): a critic (``critic.enable`` follows it and validation requires
it), groups of several samples per prompt (``rollout.n > 1``), a greedy baseline response per
prompt (the trainer generates and scores it), ``sum_pi_squared`` from the actor
(``actor.calculate_sum_pi_squared`` must be on). A user-registered estimator declares the same::

    @register_adv_est("my_estimator", needs_groups=True)
    def my_estimator(token_level_rewards, response_mask, index, config=None, **kwargs): ...

Outcome estimators use the scalar reward ``s_i = sum_t token_level_rewards[i, t]`` (the reward
managers put it on the last response token) and broadcast the advantage over the response.

A group of one (a prompt with a single sample) has no other sample to compare with. verl gives it
the baseline 0, so its advantage is its (normalised) score; ``algorithm.singleton_advantage`` picks
``"score"`` (verl's numbers, the default) or ``"zero"`` (no learning signal from a lone sample,
which otherwise pushes up every lone sample with a positive reward regardless of its quality).
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any

import numpy as np
import torch

from rlvr.trainer.config.builtin_names import AdvantageEstimatorNeeds
from rlvr.trainer.config.schema import GPG_ALPHA_COUNTS, SINGLETON_CHOICES, AlgorithmConfig
from rlvr.trainer.ppo import egpo
from rlvr.utils.config_view import config_view
from rlvr.utils.errors import ConfigError
from rlvr.utils.registry import Registry
from rlvr.utils.torch_functional import masked_whiten



class AdvantageEstimator(str, Enum):
    """Names of the registered advantage estimators (``algorithm.adv_estimator``)."""

    GAE = "gae"
    GRPO = "grpo"
    GRPO_VECTORIZED = "grpo_vectorized"
    RLOO = "rloo"
    RLOO_VECTORIZED = "rloo_vectorized"
    REINFORCE_PLUS_PLUS = "reinforce_plus_plus"
    REINFORCE_PLUS_PLUS_BASELINE = "reinforce_plus_plus_baseline"
    REMAX = "remax"
    OPO = "opo"
    GPG = "gpg"
    EGPO = "egpo"
    GRPO_PASSK = "grpo_passk"
    GDPO = "gdpo"
    OPTIMAL_TOKEN_BASELINE = "optimal_token_baseline"
    TIR_OPTIMAL_TOKEN_BASELINE = "tir_optimal_token_baseline"


AdvantageFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]
ADV_ESTIMATOR_REGISTRY: Registry[AdvantageFn] = Registry(
    "advantage estimator", AdvantageEstimatorNeeds, verl_miss="Unknown advantage estimator simply: {name}")


def estimator_name(name_or_enum: str | Enum) -> str:
    """The registry name of ``name_or_enum``: a string, or the value of any ``Enum`` member
    (``AdvantageEstimator.GRPO`` or a user's own enum, as verl accepts)."""
    return str(name_or_enum.value) if isinstance(name_or_enum, Enum) else str(name_or_enum)


def register_adv_est(name_or_enum: str | Enum, *, needs_critic: bool = False, needs_groups: bool = False,
                     needs_greedy_baseline: bool = False, reads_old_log_prob: bool = False,
                     needs_sum_pi_squared: bool = False) -> Callable[[AdvantageFn], AdvantageFn]:
    """Decorator registering an advantage estimator under ``name_or_enum`` (a string or an
    ``Enum`` member) with what it needs (:class:`AdvantageEstimatorNeeds`); another function
    under a taken name raises ``ValueError`` (the same function again, or one with its module and
    qualified name, is accepted: see :class:`~rlvr.utils.registry.Registry`)."""
    return ADV_ESTIMATOR_REGISTRY.register(estimator_name(name_or_enum), needs_critic=needs_critic,
                                           needs_groups=needs_groups, needs_greedy_baseline=needs_greedy_baseline,
                                           reads_old_log_prob=reads_old_log_prob,
                                           needs_sum_pi_squared=needs_sum_pi_squared)


def get_adv_estimator_fn(name_or_enum: str | Enum) -> AdvantageFn:
    """The estimator registered as ``name_or_enum`` (or at the object path ``pkg.module:fn``); a
    miss raises :class:`~rlvr.utils.registry.RegistryKeyError` (a ``KeyError`` and ``ValueError``)
    listing the valid names."""
    return ADV_ESTIMATOR_REGISTRY[estimator_name(name_or_enum)]


def get_adv_estimator_needs(name_or_enum: str | Enum) -> AdvantageEstimatorNeeds:
    """What the estimator registered as ``name_or_enum`` needs from the trainer."""
    return ADV_ESTIMATOR_REGISTRY.metadata(estimator_name(name_or_enum))


def _require(value: Any, estimator: str, what: str, hint: str) -> Any:
    if value is None:
        raise ValueError(f"advantage estimator '{estimator}' needs {what}, got None: {hint}")
    return value


def _algo(config: Any) -> AlgorithmConfig:
    """The algorithm section read with the schema's defaults for what ``config`` lacks (a verl
    config has no ``singleton_advantage``, ``gpg_alpha_count``, ``egpo_*``)."""
    return config_view(config, AlgorithmConfig)


def _singleton_policy(config: Any, verl_default: str) -> str:
    """``algorithm.singleton_advantage``, or the estimator's verl behaviour when it is None."""
    choice = _algo(config).singleton_advantage
    if choice is None:
        return verl_default
    if choice not in SINGLETON_CHOICES:
        raise ConfigError("algorithm.singleton_advantage", f"{choice!r} is not valid; use score, zero or null")
    return choice


def _group_ids(index: np.ndarray | None, batch_size: int, estimator: str) -> torch.Tensor:
    """Map the uid of each row to a group number 0..G-1 (order of first appearance), ``[batch]``."""
    index = _require(index, estimator, "index (the prompt uid of each row)", "pass non_tensor_batch['uid']")
    if len(index) != batch_size:
        raise ValueError(f"advantage estimator '{estimator}': index has {len(index)} entries "
                         f"but the batch has {batch_size} rows")
    numbers: dict[Any, int] = {}
    return torch.tensor([numbers.setdefault(uid, len(numbers)) for uid in index], dtype=torch.long)


def _group_stats(values: torch.Tensor, group_ids: torch.Tensor):
    """Per-row group size, mean, unbiased std (0 for a group of one) and all-equal flag, each ``[batch]``."""
    group_ids = group_ids.to(values.device)
    n_groups = int(group_ids.max()) + 1 if group_ids.numel() else 0
    counts = torch.zeros(n_groups, dtype=values.dtype, device=values.device).index_add_(
        0, group_ids, torch.ones_like(values))
    means = torch.zeros_like(counts).index_add_(0, group_ids, values) / counts
    sq_dev = torch.zeros_like(counts).index_add_(0, group_ids, (values - means[group_ids]).square())
    stds = torch.where(counts > 1, (sq_dev / (counts - 1).clamp(min=1.0)).sqrt(), torch.zeros_like(counts))
    g_max = torch.full_like(counts, -torch.inf).scatter_reduce_(0, group_ids, values, "amax")
    g_min = torch.full_like(counts, torch.inf).scatter_reduce_(0, group_ids, values, "amin")
    return counts[group_ids], means[group_ids], stds[group_ids], (g_max == g_min)[group_ids]


def _lone(advantages: torch.Tensor, size: torch.Tensor, policy: str) -> torch.Tensor:
    """Zero the rows of groups of one when the singleton policy is ``"zero"``."""
    return advantages.masked_fill(size < 2, 0.0) if policy == "zero" else advantages


def _scores(token_level_rewards: torch.Tensor) -> torch.Tensor:
    return token_level_rewards.float().sum(dim=-1)


def _broadcast(per_row: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    return per_row.unsqueeze(-1) * response_mask.float()


@register_adv_est(AdvantageEstimator.GAE, needs_critic=True)
def compute_gae_advantage_return(token_level_rewards, values, response_mask, gamma=None, lam=None, config=None,
                                 **kwargs):
    """GAE (Schulman et al. 2016, "High-Dimensional Continuous Control Using Generalized Advantage
    Estimation", arXiv:1506.02438); needs a critic's ``values [batch, response_len]``.

    Backwards over the tokens, linking only valid tokens::

        delta_t = r_t + gamma * V_next - V_t;   A_t = delta_t + gamma * lam * A_next

    where ``V_next``/``A_next`` belong to the next token *with mask 1*: masked positions (padding,
    or tool/user tokens inside a multi-turn response) are skipped, so the recursion runs across the
    gaps as if they were not there, and the value after the last valid token is 0. Rewards on
    masked positions are ignored. ``returns = A + V`` (before whitening); the advantages are then
    whitened over the mask (``masked_whiten``). ``gamma``/``lam`` default to ``config.gamma/lam``.

    Returns:
        ``(advantages, returns)``, ``[batch, response_len]``, 0 outside the mask (verl leaves the
        carried values there; the valid positions are identical).
    """
    values = _require(values, "gae", "values", "gae needs a critic: set critic.enable=true, "
                      "or choose a critic-less estimator (grpo, rloo, ...)")
    gamma = _algo(config).gamma if gamma is None else gamma
    lam = _algo(config).lam if lam is None else lam
    rewards, values, mask = token_level_rewards.float(), values.float(), response_mask.float()
    next_value = torch.zeros_like(rewards[:, 0])
    next_adv = torch.zeros_like(rewards[:, 0])
    advantages = torch.zeros_like(rewards)
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv_t = delta + gamma * lam * next_adv
        next_adv = torch.where(mask[:, t] > 0, adv_t, next_adv)
        next_value = torch.where(mask[:, t] > 0, values[:, t], next_value)
        advantages[:, t] = adv_t
    returns = (advantages + values) * mask
    advantages = masked_whiten(advantages, mask) * mask
    return advantages, returns


def _grpo(token_level_rewards, response_mask, index, epsilon, norm_adv_by_std_in_grpo, config, estimator,
          verl_singleton):
    """GRPO / Dr.GRPO advantage broadcast over the response; groups of one use baseline 0 and scale
    1 (verl) unless the singleton policy zeroes them."""
    norm = _algo(config).norm_adv_by_std_in_grpo if norm_adv_by_std_in_grpo is None else norm_adv_by_std_in_grpo
    scores = _scores(token_level_rewards)
    group_ids = _group_ids(index, scores.shape[0], estimator)
    adv = _grpo_scalar(scores, group_ids, norm, epsilon, _singleton_policy(config, verl_singleton))
    adv = _broadcast(adv, response_mask)
    return adv, adv


def _grpo_scalar(scores: torch.Tensor, group_ids: torch.Tensor, norm_by_std: bool, epsilon: float,
                 singleton: str) -> torch.Tensor:
    """GRPO advantage per row, ``[batch]``."""
    size, mean, std, _ = _group_stats(scores, group_ids)
    lone = size < 2
    adv = scores - mean.masked_fill(lone, 0.0)
    if norm_by_std:
        adv = adv / (std.masked_fill(lone, 1.0) + epsilon)
    return _lone(adv, size, singleton)


@register_adv_est(AdvantageEstimator.GRPO, needs_groups=True)
def compute_grpo_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6,
                                   norm_adv_by_std_in_grpo=None, config=None, **kwargs):
    """GRPO (Shao et al. 2024, "DeepSeekMath", arXiv:2402.03300), outcome supervision::

        A_i = (s_i - mean_g(s)) / (std_g(s) + epsilon)     (unbiased std over the group g of row i)

    With ``norm_adv_by_std_in_grpo=False`` (the argument, else ``config.norm_adv_by_std_in_grpo``)
    it is Dr.GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv:2503.20783):
    ``A_i = s_i - mean_g(s)``. All-equal groups get 0; a group of one gets ``s_i / (1 + epsilon)``
    (``s_i`` for Dr.GRPO), or 0 with ``config.singleton_advantage="zero"``.

    Returns:
        ``(advantages, returns)``, both the broadcast advantage, ``[batch, response_len]``.
    """
    return _grpo(token_level_rewards, response_mask, index, epsilon, norm_adv_by_std_in_grpo, config, "grpo",
                 "score")


@register_adv_est(AdvantageEstimator.GRPO_VECTORIZED, needs_groups=True)
def compute_grpo_vectorized_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6,
                                              norm_adv_by_std_in_grpo=None, config=None, **kwargs):
    """verl's name for its loop-free GRPO. rlvr's GRPO has no Python loop over rows, so this is
    :func:`compute_grpo_outcome_advantage` (same numbers, groups of one included)."""
    return _grpo(token_level_rewards, response_mask, index, epsilon, norm_adv_by_std_in_grpo, config,
                 "grpo_vectorized", "score")


def _rloo(token_level_rewards, response_mask, index, config, estimator, verl_singleton):
    """RLOO advantage broadcast over the response (see :func:`compute_rloo_outcome_advantage`)."""
    scores = _scores(token_level_rewards)
    size, mean, _, _ = _group_stats(scores, _group_ids(index, scores.shape[0], estimator))
    loo_mean = (mean * size - scores) / (size - 1).clamp(min=1.0)
    adv = _lone(scores - loo_mean.masked_fill(size < 2, 0.0), size, _singleton_policy(config, verl_singleton))
    adv = _broadcast(adv, response_mask)
    return adv, adv


@register_adv_est(AdvantageEstimator.RLOO, needs_groups=True)
def compute_rloo_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6, config=None,
                                   **kwargs):
    """RLOO (Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization for
    Learning from Human Feedback in LLMs", arXiv:2402.14740): leave-one-out baseline::

        A_i = s_i - (sum_g(s) - s_i) / (n_g - 1)

    A group of one has no other sample: its baseline is 0, so ``A_i = s_i`` (verl's loop version),
    or 0 with ``config.singleton_advantage="zero"``.

    Returns:
        ``(advantages, returns)``, both the broadcast advantage, ``[batch, response_len]``.
    """
    return _rloo(token_level_rewards, response_mask, index, config, "rloo", "score")


@register_adv_est(AdvantageEstimator.RLOO_VECTORIZED, needs_groups=True)
def compute_rloo_vectorized_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6,
                                              config=None, **kwargs):
    """RLOO as :func:`compute_rloo_outcome_advantage`, except that a group of one gets 0 by default,
    as verl's vectorized RLOO does (its loop version gives ``s_i``); ``config.singleton_advantage``
    overrides that."""
    return _rloo(token_level_rewards, response_mask, index, config, "rloo_vectorized", "zero")


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS)
def compute_reinforce_plus_plus_outcome_advantage(token_level_rewards, response_mask, config=None, **kwargs):
    """REINFORCE++ (Hu 2025, "REINFORCE++: A Simple and Efficient Approach for Aligning Large
    Language Models", arXiv:2501.03262): discounted return-to-go over the valid tokens,
    ``G_t = r_t + gamma * G_next`` with ``gamma = config.gamma`` (``G_next`` of the next token with
    mask 1; masked positions are skipped and their rewards ignored, so multi-turn gaps do not cut
    the return — verl resets the return at every masked token instead, which drops the final
    reward from the earlier turns; for a contiguous mask both agree). Advantages are ``G`` whitened
    over the batch mask.

    Returns:
        ``(advantages, returns)``, ``[batch, response_len]``, 0 outside the mask.
    """
    gamma = _algo(config).gamma
    rewards, mask = token_level_rewards.float(), response_mask.float()
    running = torch.zeros_like(rewards[:, 0])
    returns = torch.zeros_like(rewards)
    for t in reversed(range(rewards.shape[1])):
        running = torch.where(mask[:, t] > 0, rewards[:, t] + gamma * running, running)
        returns[:, t] = running
    returns = returns * mask
    return masked_whiten(returns, mask) * mask, returns


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS_BASELINE, needs_groups=True)
def compute_reinforce_plus_plus_baseline_outcome_advantage(token_level_rewards, response_mask, index,
                                                           epsilon=1e-6, config=None, **kwargs):
    """REINFORCE++ with baseline (Hu 2025, arXiv:2501.03262): subtract the group mean of the scalar
    reward, broadcast over the response, then whiten over all valid tokens of the batch::

        A = whiten_batch((s_i - mean_g(s)) * mask)

    A group of one has baseline 0 (``s_i`` before whitening), or ``s_i - s_i = 0`` with
    ``config.singleton_advantage="zero"``.

    Returns:
        ``(advantages, returns)``, both the whitened advantage, ``[batch, response_len]``.
    """
    scores = _scores(token_level_rewards)
    size, mean, _, _ = _group_stats(scores, _group_ids(index, scores.shape[0], "reinforce_plus_plus_baseline"))
    centered = _lone(scores - mean.masked_fill(size < 2, 0.0), size, _singleton_policy(config, "score"))
    mask = response_mask.float()
    adv = masked_whiten(_broadcast(centered, mask), mask) * mask
    return adv, adv


@register_adv_est(AdvantageEstimator.REMAX, needs_greedy_baseline=True)
def compute_remax_outcome_advantage(token_level_rewards, reward_baselines, response_mask, config=None, **kwargs):
    """ReMax (Li et al. 2023, "ReMax: A Simple, Effective, and Efficient Reinforcement Learning
    Method for Aligning Large Language Models", arXiv:2310.10505): the baseline is the reward of
    the greedy response to the same prompt, ``reward_baselines [batch]``::

        G_t = sum_{t' >= t} r_t' * m_t'   (undiscounted reward-to-go);   A_t = G_t - b_i

    Returns:
        ``(advantages, returns)``: ``A`` and ``G``, ``[batch, response_len]``, 0 outside the mask.
    """
    baselines = _require(reward_baselines, "remax", "reward_baselines (the greedy response's reward)",
                         "the trainer generates a greedy response per prompt for estimators registered "
                         "with needs_greedy_baseline=True")
    mask = response_mask.float()
    returns = (token_level_rewards.float() * mask).flip(-1).cumsum(-1).flip(-1) * mask
    return (returns - baselines.float().unsqueeze(-1)) * mask, returns


@register_adv_est(AdvantageEstimator.OPO, needs_groups=True)
def compute_opo_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6, config=None,
                                  **kwargs):
    """OPO (Hao et al. 2025, "On-Policy RL with Optimal Reward Baseline", arXiv:2505.23585): the
    length-weighted group baseline (optimal for sequence-level gradients)::

        b_g = sum_{j in g} L_j s_j / sum_{j in g} L_j,   L_j = number of valid tokens;   A_i = s_i - b_g

    A group of one has baseline 0 (``A_i = s_i``), or 0 with ``config.singleton_advantage="zero"``;
    a group whose responses are all empty gets 0 (verl divides by 0 there).

    Returns:
        ``(advantages, returns)``, both the broadcast advantage, ``[batch, response_len]``.
    """
    scores = _scores(token_level_rewards)
    lengths = response_mask.float().sum(-1)
    group_ids = _group_ids(index, scores.shape[0], "opo")
    size, mean_ls, _, _ = _group_stats(lengths * scores, group_ids)
    _, mean_l, _, _ = _group_stats(lengths, group_ids)
    baseline = torch.where(mean_l > 0, mean_ls / mean_l.clamp(min=1e-8), scores).masked_fill(size < 2, 0.0)
    adv = _broadcast(_lone(scores - baseline, size, _singleton_policy(config, "score")), response_mask)
    return adv, adv


@register_adv_est(AdvantageEstimator.GPG, needs_groups=True)
def compute_gpg_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6, f_norm=1.0,
                                  alpha=None, config=None, **kwargs):
    """GPG (Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline for Model
    Reasoning", arXiv:2504.02546): group-mean baseline, rescaled to undo the dilution of the
    gradient by samples that carry none::

        A_i = alpha * (s_i - mean_g(s)) / f_norm,   alpha = B / max(1, M)

    with ``B`` the batch size. ``config.gpg_alpha_count`` says what ``M`` counts: ``"nonzero_score"``
    (verl's numbers) the rows with a non-zero score; ``"informative"`` the rows whose group has more
    than one sample and not all scores equal — the samples that actually carry gradient, which is
    what the paper's correction is for. An ``alpha`` argument replaces the computed one (verl
    recomputes it whatever is passed). A group of one has baseline 0, or advantage 0 with
    ``config.singleton_advantage="zero"``.

    Returns:
        ``(advantages, returns)``, both the broadcast advantage, ``[batch, response_len]``.
    """
    scores = _scores(token_level_rewards)
    size, mean, _, all_equal = _group_stats(scores, _group_ids(index, scores.shape[0], "gpg"))
    count = _algo(config).gpg_alpha_count
    if count not in GPG_ALPHA_COUNTS:
        raise ConfigError("algorithm.gpg_alpha_count", f"{count!r} is not valid; use {' or '.join(GPG_ALPHA_COUNTS)}")
    if alpha is None:
        counted = scores != 0 if count == "nonzero_score" else (size > 1) & ~all_equal
        alpha = scores.shape[0] / max(1, int(counted.sum()))
    adv = alpha * (scores - mean.masked_fill(size < 2, 0.0)) / f_norm
    adv = _broadcast(_lone(adv, size, _singleton_policy(config, "score")), response_mask)
    return adv, adv


@register_adv_est(AdvantageEstimator.EGPO, needs_groups=True, reads_old_log_prob=True)
def compute_egpo_outcome_advantage(token_level_rewards, response_mask, index, old_log_prob=None,
                                   rollout_log_prob=None, epsilon=1e-6, config=None, **kwargs):
    """EGPO (Zhao et al. 2026, "Know What You Know: Metacognitive Entropy Calibration for Verifiable
    RL Reasoning", arXiv:2602.22751), critic-less. The full formula and every choice are in
    ``rlvr.trainer.ppo.egpo``'s module docstring. In short: ``u_i`` = mean negative log-prob of the
    sampled tokens (from ``old_log_prob``, else ``rollout_log_prob``), confidence
    ``c_i = sigmoid(-(u_i - mean u) / (std u + eps))`` (within the group or the batch,
    ``config.egpo_uncertainty_norm``), then the GRPO advantage is calibrated asymmetrically:
    positive kept, negative scaled by ``1 + alpha (2c - 1)``, all-correct groups ``+beta (1 - c)``,
    all-wrong groups ``-beta c``; a group of one keeps its GRPO advantage (``singleton_advantage``).

    Returns:
        ``(advantages, returns)``, both the broadcast advantage, ``[batch, response_len]``.
    """
    config = _algo(config)
    log_prob = old_log_prob if old_log_prob is not None else rollout_log_prob
    log_prob = _require(log_prob, "egpo", "old_log_prob or rollout_log_prob",
                        "compute the actor's log-probs before the advantages")
    if config.egpo_uncertainty_norm not in ("group", "batch"):
        raise ConfigError("algorithm.egpo_uncertainty_norm",
                          f"must be 'group' or 'batch', got {config.egpo_uncertainty_norm!r}")
    scores = _scores(token_level_rewards)
    group_ids = _group_ids(index, scores.shape[0], "egpo")
    grpo_adv = _grpo_scalar(scores, group_ids, config.norm_adv_by_std_in_grpo, epsilon,
                            _singleton_policy(config, "score"))
    size, _, _, all_equal = _group_stats(scores, group_ids)
    uncertainty = egpo.entropy_proxy(log_prob, response_mask)
    norm_ids = group_ids if config.egpo_uncertainty_norm == "group" else torch.zeros_like(group_ids)
    _, u_mean, u_std, _ = _group_stats(uncertainty, norm_ids)
    conf = egpo.confidence(uncertainty, u_mean, u_std, epsilon)
    adv = egpo.calibrate_advantages(grpo_adv, scores, conf, all_equal & (size > 1), config.egpo_alpha,
                                    config.egpo_beta, config.egpo_correct_threshold)
    adv = _broadcast(adv, response_mask)
    return adv, adv


# The estimators of these modules register with the ones above whenever the registry is imported
# (they import this module's helpers, so they come last): gdpo, grpo_passk; optimal_token_baseline,
# tir_optimal_token_baseline.
from rlvr.trainer.ppo import grpo_variants, optimal_baseline  # noqa: E402,F401
