"""The driver's steps on a training batch, as verl's module functions of ``verl.trainer.ppo.ray_trainer``
(re-exported there): the response mask, the KL penalty in the reward, the advantage through the
estimator registry, and the speculative-decoding metrics of a rollout engine that reports them.
:class:`~rlvr.trainer.ppo.ray_trainer.RayPPOTrainer` runs its steps through these functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from rlvr.protocol import DataProto
from rlvr.trainer.ppo.advantage import estimator_name
from rlvr.trainer.ppo.core_algos import get_adv_estimator_fn, kl_penalty
from rlvr.utils.errors import ProtocolError
from rlvr.utils.torch_functional import masked_mean

__all__ = ["apply_kl_penalty", "compute_advantage", "compute_response_mask", "compute_spec_decode_metrics"]

OPTIONAL_INPUTS = {"values": "values", "reward_baselines": "reward_baselines", "old_log_prob": "old_log_probs",
                   "old_log_probs": "old_log_probs", "rollout_log_prob": "rollout_log_probs",
                   "sum_pi_squared": "sum_pi_squared", "rollout_is_weights": "rollout_is_weights"}
"""Estimator argument -> batch key of the inputs an estimator may read (None when absent)."""


def compute_response_mask(data: DataProto) -> torch.Tensor:
    """``attention_mask`` over the response positions, ``[batch, response_len]``."""
    return data.batch["attention_mask"][:, -data.batch["responses"].size(1):]


def apply_kl_penalty(data: DataProto, kl_ctrl: Any, kl_penalty: str = "kl") -> tuple[DataProto, dict[str, float]]:
    """``token_level_rewards = token_level_scores - beta * KL(old || ref)`` per response token
    (Ziegler et al. 2019, arXiv:1909.08593), ``beta`` the controller's value; the controller is then
    updated with the batch's mean sequence KL.

    Returns:
        ``(data, {"actor/reward_kl_penalty": mean KL, "actor/reward_kl_penalty_coeff": beta})``.
    """
    tensors, mask = data.batch, data.batch["response_mask"]
    kld = _kl(tensors["old_log_probs"], tensors["ref_log_prob"], kl_penalty) * mask  # [batch, response_len]
    beta = kl_ctrl.value
    tensors["token_level_rewards"] = tensors["token_level_scores"] - beta * kld
    current_kl = masked_mean(kld, mask, axis=-1).mean().item()
    kl_ctrl.update(current_kl=current_kl, n_steps=len(data))
    return data, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}


_kl = kl_penalty  # the estimator, under a name the argument ``kl_penalty`` does not hide


def compute_advantage(data: DataProto, adv_estimator: Any, gamma: float = 1.0, lam: float = 1.0, num_repeat: int = 1,
                      norm_adv_by_std_in_grpo: bool = True, config: Any = None) -> DataProto:
    """``advantages`` and ``returns`` ``[batch, response_len]`` into ``data`` from the estimator
    registered as ``adv_estimator`` (verl's function).

    The estimator gets ``token_level_rewards``, ``response_mask`` (built from ``attention_mask`` when
    the batch has none), the prompt ids ``uid``, the batch's ``values``, ``reward_baselines``,
    ``old_log_probs``, ``rollout_log_probs``, ``sum_pi_squared`` and ``rollout_is_weights`` where
    present (None otherwise), the whole batch (``batch``, ``non_tensor_batch``: GDPO's per-key
    scores) and ``config`` (the algorithm section);
    GAE also ``gamma`` / ``lam`` and GRPO ``norm_adv_by_std_in_grpo`` from the arguments, as in verl.
    ``num_repeat`` is unused (verl's signature).
    """
    tensors = data.batch
    if "response_mask" not in tensors.keys():
        tensors["response_mask"] = compute_response_mask(data)
    name = estimator_name(adv_estimator)
    kwargs = {arg: tensors[key] if key in tensors.keys() else None for arg, key in OPTIONAL_INPUTS.items()}
    if name == "gae":
        kwargs.update(gamma=gamma, lam=lam)
    elif name == "grpo":
        kwargs["norm_adv_by_std_in_grpo"] = norm_adv_by_std_in_grpo
    advantages, returns = get_adv_estimator_fn(adv_estimator)(
        token_level_rewards=tensors["token_level_rewards"], response_mask=tensors["response_mask"],
        index=data.non_tensor_batch.get("uid"), non_tensor_batch=data.non_tensor_batch, batch=tensors,
        config=config, **kwargs)
    tensors["advantages"], tensors["returns"] = advantages, returns
    return data


def compute_spec_decode_metrics(spec_drafts: Sequence[float] | None, spec_accepts: Sequence[float] | None,
                                spec_verifies: Sequence[float] | None,
                                non_padding_mask: Sequence[bool] | None = None) -> dict[str, float]:
    """Speculative decoding of a rollout engine, per request then averaged: accept rate
    ``accepted / drafted`` and accept length ``1 + accepted / verify steps`` (0 for a request with
    no drafts / verify steps); padding rows dropped with ``non_padding_mask``. ``{}`` without stats.

    Raises:
        ProtocolError: some of the three per-request lists given and some not.
    """
    given = [x is not None for x in (spec_drafts, spec_accepts, spec_verifies)]
    if not any(given):
        return {}
    if not all(given):
        raise ProtocolError("speculative-decoding metrics need the drafted, accepted and verify-step counts "
                            "of every request; got only some of them")
    rows = np.column_stack([np.asarray(x, dtype=np.float64) for x in (spec_drafts, spec_accepts, spec_verifies)])
    if non_padding_mask is not None:
        rows = rows[np.asarray(non_padding_mask, dtype=bool)]
    if len(rows) == 0:
        return {}
    rates = [accepted / drafted if drafted > 0 else 0.0 for drafted, accepted, _ in rows.tolist()]
    lengths = [1.0 + accepted / steps if steps > 0 else 0.0 for _, accepted, steps in rows.tolist()]
    return {"rollout/spec_accept_rate": sum(rates) / len(rates), "rollout/spec_accept_length": sum(lengths) / len(lengths)}
