"""Staleness from per-token weight versions (pure torch).

Every sampled token carries the version of the weights that sampled it (``response_versions
[B, R]``, -1 on tokens that were not sampled: see :mod:`rlvr.workers.rollout.base`). When the policy
at version ``v`` trains on a sample, a token's *lag* is ``v - version``, and the sample's
*staleness* is the lag of its oldest sampled token: a partial rollout mixes versions along a row,
and the bound of an asynchronous run (``async_training.max_staleness``; AReaL's
``max_head_offpolicyness``, Fu et al. 2025, arXiv:2505.24298) holds for every token of a sample
when it holds for its oldest one.
"""

from __future__ import annotations

import torch

from rlvr.utils.errors import StaleRolloutError

__all__ = ["sample_staleness", "staleness_metrics", "check_staleness_bound"]


def sample_staleness(versions: torch.Tensor, response_mask: torch.Tensor, policy_version: int) -> torch.Tensor:
    """Staleness of each sample ``[B]`` (int64): ``policy_version`` minus its oldest sampled token's
    version (0 for a row without a sampled token).

    Args:
        versions: ``[B, R]`` weight version of each response token (``response_versions``).
        response_mask: ``[B, R]``, 1 on sampled tokens.
        policy_version: the version of the policy that trains on the samples.
    """
    sampled = response_mask.bool()
    oldest = torch.where(sampled, versions, torch.iinfo(torch.long).max).amin(dim=-1)
    return torch.where(sampled.any(dim=-1), policy_version - oldest, 0)


def staleness_metrics(versions: torch.Tensor, response_mask: torch.Tensor, policy_version: int,
                      bound: int) -> dict[str, float]:
    """How stale a training batch is: ``async/staleness_mean`` and ``async/staleness_max`` over the
    samples, ``async/samples_staleness_<k>`` (the share of samples whose staleness is ``k``) and
    ``async/tokens_lag_<k>`` (the share of sampled tokens whose lag is ``k``), for ``k = 0..bound``
    (a fixed set of keys per run), and ``async/mixed_version_samples`` (the share of samples whose
    tokens come from more than one version: partial rollouts).

    Args:
        versions, response_mask: ``[B, R]``.
        policy_version: the version of the policy that trains on the batch.
        bound: the run's staleness bound.
    """
    sampled = response_mask.bool()
    staleness = sample_staleness(versions, response_mask, policy_version).float()
    lags = (policy_version - versions)[sampled]
    newest = torch.where(sampled, versions, torch.iinfo(torch.long).min).amax(dim=-1)
    mixed = sampled.any(dim=-1) & (newest != policy_version - staleness.long())
    metrics = {"async/staleness_mean": staleness.mean().item(), "async/staleness_max": staleness.max().item(),
               "async/mixed_version_samples": mixed.float().mean().item()}
    for k in range(bound + 1):
        metrics[f"async/samples_staleness_{k}"] = (staleness == k).float().mean().item()
        metrics[f"async/tokens_lag_{k}"] = (lags == k).float().mean().item() if lags.numel() else 0.0
    return metrics


def check_staleness_bound(versions: torch.Tensor, response_mask: torch.Tensor, policy_version: int,
                          bound: int) -> None:
    """Refuse a batch with a token older than ``bound`` versions, or one from a version the policy
    has not reached (a rollout ahead of the trainer: weights from another run).

    Raises:
        StaleRolloutError: naming the worst sample, its staleness and the bound.
    """
    sampled = response_mask.bool()
    staleness = sample_staleness(versions, response_mask, policy_version)
    newest = torch.where(sampled, versions, -1).amax(dim=-1)
    if bool((newest > policy_version).any()):
        row = int(newest.argmax())
        raise StaleRolloutError(
            f"sample {row} has tokens of weights version {int(newest[row])}, newer than the policy's version "
            f"{policy_version}: the rollout holds weights the trainer never pushed (a rollout worker of another "
            "run, or a version counter restored from another checkpoint)")
    if bool((staleness > bound).any()):
        row = int(staleness.argmax())
        raise StaleRolloutError(
            f"sample {row} is {int(staleness[row])} weight versions older than the policy it would train "
            f"(version {policy_version}), over the bound of {bound} (async_training.max_staleness); the schedule "
            "must never let this happen: please report it with the run's config")
