"""Advantage estimators and their registry.

One calling convention (the trainer never special-cases an estimator)::

    advantages, returns = get_adv_estimator_fn(name)(
        token_level_rewards=..., response_mask=..., index=..., values=..., reward_baselines=...,
        old_log_prob=..., rollout_log_prob=..., gamma=..., lam=..., config=..., epsilon=1e-6)

Shapes: ``token_level_rewards``, ``response_mask``, ``values``, ``old_log_prob``,
``rollout_log_prob`` are ``[batch, response_len]``; ``reward_baselines`` is ``[batch]``; ``index``
is a numpy object array ``[batch]`` with the uid of each row's prompt (rows of one prompt form a
group). Every estimator takes what it needs, ignores the rest (``**kwargs``), raises a clear error
when a needed input is None, and returns float32 ``(advantages, returns)``, both
``[batch, response_len]`` and zero outside the response mask. ``gamma``/``lam`` passed as keywords
win over ``config.gamma``/``config.lam``, which are used when the keywords are None.

Outcome estimators use the scalar reward ``s_i = sum_t token_level_rewards[i, t]`` (the reward
managers put it on the last response token) and broadcast the advantage over the response.
Groups of one get advantage 0 in every group-baseline estimator (grpo, rloo, opo, gpg,
reinforce_plus_plus_baseline, egpo): a lone sample has no baseline to compare with. verl gives it
its raw reward instead, which pushes up every lone sample with a positive reward regardless of
its quality.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np
import torch

from rlvr.trainer.ppo import egpo
from rlvr.utils.registry import Registry
from rlvr.utils.torch_functional import masked_whiten


class AdvantageEstimator(str, Enum):
    """Names of the registered advantage estimators (``algorithm.adv_estimator``)."""

    GAE = "gae"
    GRPO = "grpo"
    RLOO = "rloo"
    REINFORCE_PLUS_PLUS = "reinforce_plus_plus"
    REINFORCE_PLUS_PLUS_BASELINE = "reinforce_plus_plus_baseline"
    REMAX = "remax"
    OPO = "opo"
    GPG = "gpg"
    EGPO = "egpo"


@dataclass
class AdvantageConfig:
    """Parameters of the advantage estimators (``algorithm.*``)."""

    gamma: float = field(default=1.0, metadata={"help": "discount factor (gae, reinforce_plus_plus)"})
    lam: float = field(default=1.0, metadata={"help": "GAE lambda (gae)"})
    norm_adv_by_std_in_grpo: bool = field(
        default=True, metadata={"help": "divide GRPO/EGPO advantages by the group std; False = Dr.GRPO"})
    egpo_alpha: float = field(
        default=0.5, metadata={"help": "EGPO: confidence scaling of negative advantages, in [0, 1]"})
    egpo_beta: float = field(
        default=0.1, metadata={"help": "EGPO: size of the advantages recovered in all-equal-reward groups"})
    egpo_correct_threshold: float = field(
        default=0.5, metadata={"help": "EGPO: a scalar reward >= this counts as correct"})
    egpo_uncertainty_norm: str = field(
        default="group", metadata={"help": "EGPO: standardise the entropy proxy in the 'group' or the 'batch'"})


AdvantageFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]
ADV_ESTIMATOR_REGISTRY: Registry[AdvantageFn] = Registry("advantage estimator")


def _name(name: str | AdvantageEstimator) -> str:
    return name.value if isinstance(name, AdvantageEstimator) else str(name)


def register_adv_est(name: str | AdvantageEstimator) -> Callable[[AdvantageFn], AdvantageFn]:
    """Decorator registering an advantage estimator under ``name`` (str or ``AdvantageEstimator``);
    a duplicate name raises ``ValueError``."""
    return ADV_ESTIMATOR_REGISTRY.register(_name(name))


def get_adv_estimator_fn(name: str | AdvantageEstimator) -> AdvantageFn:
    """Return the estimator registered as ``name``; a miss raises ``KeyError`` listing valid names."""
    return ADV_ESTIMATOR_REGISTRY.get(_name(name))


def _require(value: Any, estimator: str, what: str, hint: str) -> Any:
    if value is None:
        raise ValueError(f"advantage estimator '{estimator}' needs {what}, got None: {hint}")
    return value


def _config(config: AdvantageConfig | None) -> AdvantageConfig:
    return AdvantageConfig() if config is None else config


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


def _scores(token_level_rewards: torch.Tensor) -> torch.Tensor:
    return token_level_rewards.float().sum(dim=-1)


def _broadcast(per_row: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    return per_row.unsqueeze(-1) * response_mask.float()


@register_adv_est(AdvantageEstimator.GAE)
def compute_gae_advantage_return(token_level_rewards, response_mask, values=None, gamma=None, lam=None,
                                 config=None, **kwargs):
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
        ``(advantages, returns)``, ``[batch, response_len]``, 0 outside the mask.
    """
    values = _require(values, "gae", "values", "gae needs a critic: set critic.enable=true, "
                      "or choose a critic-less estimator (grpo, rloo, ...)")
    config = _config(config)
    gamma = config.gamma if gamma is None else gamma
    lam = config.lam if lam is None else lam
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


def _grpo_scalar(scores: torch.Tensor, group_ids: torch.Tensor, config: AdvantageConfig,
                 epsilon: float) -> torch.Tensor:
    """GRPO / Dr.GRPO advantage per row, ``[batch]``; 0 for groups of one."""
    size, mean, std, _ = _group_stats(scores, group_ids)
    adv = scores - mean
    if config.norm_adv_by_std_in_grpo:
        adv = adv / (std + epsilon)
    return torch.where(size > 1, adv, torch.zeros_like(adv))


@register_adv_est(AdvantageEstimator.GRPO)
def compute_grpo_outcome_advantage(token_level_rewards, response_mask, index=None, config=None, epsilon=1e-6,
                                   **kwargs):
    """GRPO (Shao et al. 2024, "DeepSeekMath", arXiv:2402.03300), outcome supervision::

        A_i = (s_i - mean_g(s)) / (std_g(s) + epsilon)     (unbiased std over the group g of row i)

    With ``config.norm_adv_by_std_in_grpo=False`` it is Dr.GRPO (Liu et al. 2025, "Understanding
    R1-Zero-Like Training", arXiv:2503.20783): ``A_i = s_i - mean_g(s)``. Groups of one get 0;
    all-equal groups get 0.

    Returns:
        ``(advantages, returns)``, both the broadcast advantage, ``[batch, response_len]``.
    """
    scores = _scores(token_level_rewards)
    adv = _grpo_scalar(scores, _group_ids(index, scores.shape[0], "grpo"), _config(config), epsilon)
    adv = _broadcast(adv, response_mask)
    return adv, adv


@register_adv_est(AdvantageEstimator.RLOO)
def compute_rloo_outcome_advantage(token_level_rewards, response_mask, index=None, **kwargs):
    """RLOO (Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization for
    Learning from Human Feedback in LLMs", arXiv:2402.14740): leave-one-out baseline::

        A_i = s_i - (sum_g(s) - s_i) / (n_g - 1)        (0 for a group of one)

    Returns:
        ``(advantages, returns)``, both the broadcast advantage, ``[batch, response_len]``.
    """
    scores = _scores(token_level_rewards)
    size, mean, _, _ = _group_stats(scores, _group_ids(index, scores.shape[0], "rloo"))
    loo_mean = (mean * size - scores) / (size - 1).clamp(min=1.0)
    adv = _broadcast(torch.where(size > 1, scores - loo_mean, torch.zeros_like(scores)), response_mask)
    return adv, adv


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS)
def compute_reinforce_plus_plus_outcome_advantage(token_level_rewards, response_mask, gamma=None, config=None,
                                                  **kwargs):
    """REINFORCE++ (Hu 2025, "REINFORCE++: A Simple and Efficient Approach for Aligning Large
    Language Models", arXiv:2501.03262): discounted return-to-go over the valid tokens,
    ``G_t = r_t + gamma * G_next`` (``G_next`` of the next token with mask 1; masked positions are
    skipped and their rewards ignored, so multi-turn gaps do not cut the return — verl resets the
    return at every masked token instead, which drops the final reward from the earlier turns).
    Advantages are ``G`` whitened over the batch mask. ``gamma`` defaults to ``config.gamma``.

    Returns:
        ``(advantages, returns)``, ``[batch, response_len]``, 0 outside the mask.
    """
    gamma = _config(config).gamma if gamma is None else gamma
    rewards, mask = token_level_rewards.float(), response_mask.float()
    running = torch.zeros_like(rewards[:, 0])
    returns = torch.zeros_like(rewards)
    for t in reversed(range(rewards.shape[1])):
        running = torch.where(mask[:, t] > 0, rewards[:, t] + gamma * running, running)
        returns[:, t] = running
    returns = returns * mask
    return masked_whiten(returns, mask) * mask, returns


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS_BASELINE)
def compute_reinforce_plus_plus_baseline_outcome_advantage(token_level_rewards, response_mask, index=None,
                                                           **kwargs):
    """REINFORCE++ with baseline (Hu 2025, arXiv:2501.03262): subtract the group mean of the scalar
    reward, broadcast over the response, then whiten over all valid tokens of the batch::

        A = whiten_batch((s_i - mean_g(s)) * mask)      (a group of one gives s_i - s_i = 0)

    Returns:
        ``(advantages, returns)``, both the whitened advantage, ``[batch, response_len]``.
    """
    scores = _scores(token_level_rewards)
    _, mean, _, _ = _group_stats(scores, _group_ids(index, scores.shape[0], "reinforce_plus_plus_baseline"))
    mask = response_mask.float()
    adv = masked_whiten(_broadcast(scores - mean, mask), mask) * mask
    return adv, adv


@register_adv_est(AdvantageEstimator.REMAX)
def compute_remax_outcome_advantage(token_level_rewards, response_mask, reward_baselines=None, **kwargs):
    """ReMax (Li et al. 2023, "ReMax: A Simple, Effective, and Efficient Reinforcement Learning
    Method for Aligning Large Language Models", arXiv:2310.10505): the baseline is the reward of
    the greedy response to the same prompt, ``reward_baselines [batch]``::

        G_t = sum_{t' >= t} r_t' * m_t'   (undiscounted reward-to-go);   A_t = G_t - b_i

    Returns:
        ``(advantages, returns)``: ``A`` and ``G``, ``[batch, response_len]``, 0 outside the mask.
    """
    baselines = _require(reward_baselines, "remax", "reward_baselines (the greedy response's reward)",
                         "the trainer must generate a greedy rollout per prompt and score it for remax")
    mask = response_mask.float()
    returns = (token_level_rewards.float() * mask).flip(-1).cumsum(-1).flip(-1) * mask
    return (returns - baselines.float().unsqueeze(-1)) * mask, returns


@register_adv_est(AdvantageEstimator.OPO)
def compute_opo_outcome_advantage(token_level_rewards, response_mask, index=None, **kwargs):
    """OPO (Hao et al. 2025, "On-Policy RL with Optimal Reward Baseline", arXiv:2505.23585): the
    length-weighted group baseline (optimal for sequence-level gradients)::

        b_g = sum_{j in g} L_j s_j / sum_{j in g} L_j,   L_j = number of valid tokens;   A_i = s_i - b_g

    A group of one gives ``s_i - s_i = 0`` (verl uses ``b = 0`` there).

    Returns:
        ``(advantages, returns)``, both the broadcast advantage, ``[batch, response_len]``.
    """
    scores = _scores(token_level_rewards)
    lengths = response_mask.float().sum(-1)
    group_ids = _group_ids(index, scores.shape[0], "opo")
    size, mean_ls, _, _ = _group_stats(lengths * scores, group_ids)
    _, mean_l, _, _ = _group_stats(lengths, group_ids)
    baseline = torch.where(mean_l > 0, mean_ls / mean_l.clamp(min=1e-8), scores)
    adv = _broadcast(torch.where(size > 1, scores - baseline, torch.zeros_like(scores)), response_mask)
    return adv, adv


@register_adv_est(AdvantageEstimator.GPG)
def compute_gpg_outcome_advantage(token_level_rewards, response_mask, index=None, **kwargs):
    """GPG (Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline for Model
    Reasoning", arXiv:2504.02546): group-mean baseline, rescaled to undo the dilution of the
    gradient by samples that carry none::

        A_i = alpha * (s_i - mean_g(s)),   alpha = B / max(1, M)

    where ``B`` is the batch size and ``M`` the number of valid samples: rows whose group has more
    than one sample and not all rewards equal (the others have ``A = 0`` and no gradient). verl
    counts the rows with a non-zero reward as ``M`` instead; we count the samples that actually
    carry gradient, which is what the paper's correction is for. The optional std normalisation
    ``F_norm`` of the paper is not applied (``F_norm = 1``).

    Returns:
        ``(advantages, returns)``, both the broadcast advantage, ``[batch, response_len]``.
    """
    scores = _scores(token_level_rewards)
    size, mean, _, all_equal = _group_stats(scores, _group_ids(index, scores.shape[0], "gpg"))
    valid = (size > 1) & ~all_equal
    alpha = scores.shape[0] / max(1, int(valid.sum()))
    adv = _broadcast(torch.where(valid, alpha * (scores - mean), torch.zeros_like(scores)), response_mask)
    return adv, adv


@register_adv_est(AdvantageEstimator.EGPO)
def compute_egpo_outcome_advantage(token_level_rewards, response_mask, index=None, old_log_prob=None,
                                   rollout_log_prob=None, config=None, epsilon=1e-6, **kwargs):
    """EGPO (Zhao et al. 2026, "Know What You Know: Metacognitive Entropy Calibration for Verifiable
    RL Reasoning", arXiv:2602.22751), critic-less. The full formula and every choice are in
    ``rlvr.trainer.ppo.egpo``'s module docstring. In short: ``u_i`` = mean negative log-prob of the
    sampled tokens (from ``old_log_prob``, else ``rollout_log_prob``), confidence
    ``c_i = sigmoid(-(u_i - mean u) / (std u + eps))`` (within the group or the batch,
    ``config.egpo_uncertainty_norm``), then the GRPO advantage is calibrated asymmetrically:
    positive kept, negative scaled by ``1 + alpha (2c - 1)``, all-correct groups ``+beta (1 - c)``,
    all-wrong groups ``-beta c``, groups of one 0.

    Returns:
        ``(advantages, returns)``, both the broadcast advantage, ``[batch, response_len]``.
    """
    config = _config(config)
    log_prob = old_log_prob if old_log_prob is not None else rollout_log_prob
    log_prob = _require(log_prob, "egpo", "old_log_prob or rollout_log_prob",
                        "compute the actor's log-probs before the advantages")
    if config.egpo_uncertainty_norm not in ("group", "batch"):
        raise ValueError(f"egpo_uncertainty_norm must be 'group' or 'batch', got {config.egpo_uncertainty_norm!r}")
    scores = _scores(token_level_rewards)
    group_ids = _group_ids(index, scores.shape[0], "egpo")
    grpo_adv = _grpo_scalar(scores, group_ids, config, epsilon)
    size, _, _, all_equal = _group_stats(scores, group_ids)
    uncertainty = egpo.entropy_proxy(log_prob, response_mask)
    norm_ids = group_ids if config.egpo_uncertainty_norm == "group" else torch.zeros_like(group_ids)
    _, u_mean, u_std, _ = _group_stats(uncertainty, norm_ids)
    conf = egpo.confidence(uncertainty, u_mean, u_std, epsilon)
    adv = egpo.calibrate_advantages(grpo_adv, scores, conf, size, all_equal, config.egpo_alpha,
                                    config.egpo_beta, config.egpo_correct_threshold)
    adv = _broadcast(adv, response_mask)
    return adv, adv
