"""Group-relative estimators built on GRPO's normalisation: GDPO and GRPO for pass@k.

Registered under verl 0.9's names, with its leading parameters (see :mod:`rlvr.trainer.ppo.advantage`
for the calling convention, the shapes and the singleton policy).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rlvr.trainer.ppo.advantage import (
    AdvantageEstimator,
    _algo,
    _broadcast,
    _group_ids,
    _group_stats,
    _grpo_scalar,
    _scores,
    _singleton_policy,
    register_adv_est,
)
from rlvr.trainer.config.schema import AlgorithmConfig
from rlvr.utils.errors import ConfigError
from rlvr.utils.torch_functional import masked_whiten

__all__ = ["compute_gdpo_outcome_advantage", "compute_grpo_passk_outcome_advantage", "gdpo_reward_scores"]


def gdpo_reward_scores(non_tensor_batch: dict[str, Any], keys: list[str], batch_size: int) -> list[torch.Tensor]:
    """The per-sample score of each reward key, ``[batch]`` float32 each, from the batch's non-tensor
    fields (the trainer puts the reward function's extra info named in ``algorithm.gdpo_reward_keys``
    there).

    Raises:
        ValueError: a key is not in ``non_tensor_batch``, or has not one number per row.
    """
    scores = []
    for key in keys:
        if key not in non_tensor_batch:
            raise ValueError(f"GDPO reward key {key!r} is not among the batch's fields ({sorted(non_tensor_batch)}); "
                             f"make the reward function's compute_score return a dict with {key!r}")
        values = np.asarray(non_tensor_batch[key], dtype=np.float32)
        if values.shape != (batch_size,):
            raise ValueError(f"GDPO reward key {key!r} holds {values.shape} values; one number per row "
                             f"({batch_size}) is needed")
        scores.append(torch.from_numpy(values))
    return scores


def _gdpo_weights(algo: AlgorithmConfig, count: int) -> list[float]:
    weights = algo.gdpo_reward_weights
    if weights is None:
        return [1.0] * count
    if len(weights) != count:
        raise ConfigError("algorithm.gdpo_reward_weights", f"has {len(weights)} weights for {count} reward keys "
                          "(algorithm.gdpo_reward_keys); give one weight per key")
    return [float(w) for w in weights]


@register_adv_est(AdvantageEstimator.GDPO, needs_groups=True)
def compute_gdpo_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6,
                                   norm_adv_by_std_in_grpo=None, config=None, non_tensor_batch=None, batch=None,
                                   **kwargs):
    """GDPO (Liu et al. 2026, "GDPO: Group reward-Decoupled Normalization Policy Optimization for
    Multi-reward RL Optimization", arXiv:2601.05242). Each reward dimension ``k`` (the keys of
    ``config.gdpo_reward_keys``, read from ``non_tensor_batch``) is GRPO-normalised within its group
    on its own, the results are summed with ``config.gdpo_reward_weights`` (default 1 each), and the
    sum is whitened over the valid tokens of the batch::

        A_k,i = (s_k,i - mean_g(s_k)) / (std_g(s_k) + epsilon)
        A     = whiten_batch(sum_k w_k A_k,i * mask)

    so a reward with a large scale does not drown the others, as summing first would. Without
    ``config``, ``non_tensor_batch`` and ``batch`` all given (verl's condition) the one dimension is
    the summed ``token_level_rewards``. ``norm_adv_by_std_in_grpo`` (None: the config's) and groups of
    one follow :func:`~rlvr.trainer.ppo.advantage.compute_grpo_outcome_advantage`. ``batch`` is not
    read otherwise: GRPO sums a row's rewards, so where in the response a key's score sits (verl
    puts it on the last response token) does not change the numbers.

    Returns:
        ``(advantages, returns)``, both the whitened advantage, ``[batch, response_len]``.

    Raises:
        ConfigError: multi-key mode without ``gdpo_reward_keys``, or a weight count that differs.
    """
    algo = _algo(config)
    norm = algo.norm_adv_by_std_in_grpo if norm_adv_by_std_in_grpo is None else norm_adv_by_std_in_grpo
    rows = token_level_rewards.shape[0]
    if config is not None and non_tensor_batch is not None and batch is not None:
        keys = algo.gdpo_reward_keys
        if not keys:
            raise ConfigError("algorithm.gdpo_reward_keys", "GDPO needs the reward components to normalise: list "
                              "the keys of your compute_score's dict, e.g. [format_reward, accuracy_reward]")
        dimensions = gdpo_reward_scores(non_tensor_batch, list(keys), rows)
    else:
        dimensions = [_scores(token_level_rewards)]
    group_ids = _group_ids(index, rows, "gdpo")
    singleton = _singleton_policy(config, "score")
    mask = response_mask.float()
    total = torch.zeros(rows, device=mask.device)
    for weight, scores in zip(_gdpo_weights(algo, len(dimensions)), dimensions):
        total = total + weight * _grpo_scalar(scores.float().to(mask.device), group_ids, norm, epsilon, singleton)
    adv = masked_whiten(_broadcast(total, mask), mask) * mask
    return adv, adv


@register_adv_est(AdvantageEstimator.GRPO_PASSK, needs_groups=True)
def compute_grpo_passk_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6,
                                         norm_adv_by_std_in_grpo=None, config=None, **kwargs):
    """GRPO for pass@k (verl's ``grpo_passk``, after arXiv:2503.19595): only the best response of each
    group learns, by its margin over the runner-up::

        A_best = (s_max - s_second) / (std_g(s) + epsilon)      (no division without norm_adv_by_std_in_grpo)
        A_i    = 0 for every other response

    ``norm_adv_by_std_in_grpo`` is the argument, else ``config.norm_adv_by_std_in_grpo``. A tie for
    the best gives 0. Every group needs at least 2 samples.

    Returns:
        ``(advantages, returns)``, both the broadcast advantage, ``[batch, response_len]``.

    Raises:
        ValueError: a group of one sample.
    """
    norm = _algo(config).norm_adv_by_std_in_grpo if norm_adv_by_std_in_grpo is None else norm_adv_by_std_in_grpo
    scores = _scores(token_level_rewards)
    group_ids = _group_ids(index, scores.shape[0], "grpo_passk").to(scores.device)
    size, _, std, _ = _group_stats(scores, group_ids)
    if bool((size < 2).any()):
        lone = index[int((size < 2).nonzero()[0])]
        raise ValueError(f"grpo_passk needs at least 2 samples per group; prompt '{lone}' has 1 "
                         "(set actor_rollout_ref.rollout.n >= 2)")
    groups = int(group_ids.max()) + 1
    best = torch.full((groups,), -torch.inf, device=scores.device).scatter_reduce(0, group_ids, scores, "amax")
    is_best = scores == best[group_ids]
    # the first row holding the maximum is the best one; the runner-up is the maximum of the others
    rows = torch.arange(scores.shape[0], device=scores.device)
    first = torch.full((groups,), scores.shape[0], device=scores.device).scatter_reduce(
        0, group_ids, torch.where(is_best, rows, scores.shape[0]), "amin")
    winner = rows == first[group_ids]
    runner_up = torch.full((groups,), -torch.inf, device=scores.device).scatter_reduce(
        0, group_ids, scores.masked_fill(winner, -torch.inf), "amax")
    margin = (best - runner_up)[group_ids]
    if norm:
        margin = margin / (std + epsilon)
    adv = _broadcast(torch.where(winner, margin, torch.zeros_like(scores)), response_mask)
    return adv, adv
