"""KL penalties between the policy and the reference model, and the KL-coefficient controllers.

All estimators take per-token log-probabilities of the sampled tokens (``[batch, response_len]``)
except ``"full"``, which takes full-vocabulary log-probabilities (``[..., vocab]``). Inputs may be
bf16/fp16; everything is computed in float32. See J. Schulman, "Approximating KL Divergence"
(http://joschu.net/blog/kl-approx.html) for k1/k2/k3.
"""

from __future__ import annotations

from typing import Any

import torch

from rlvr.utils.errors import ConfigAssertionError, UnsupportedConfigError

LOG_RATIO_CLAMP = 20.0
"""Log-ratios are clamped to ``[-20, 20]`` before ``exp`` so that ``exp`` never overflows."""

K3_CLAMP = 10.0
"""The k3 (``low_var_kl``) estimate is clamped to ``[-10, 10]`` per token (as verl does) to bound
the effect of the rare tokens where the policy and the reference disagree wildly."""

_KL_ALIASES = {"kl": "k1", "k1": "k1", "abs": "abs", "mse": "k2", "k2": "k2", "low_var_kl": "k3", "k3": "k3"}
KL_PENALTY_NAMES = tuple(sorted([*_KL_ALIASES, "full", *(f"{name}+" for name in _KL_ALIASES)]))
"""Every valid ``kl_penalty`` name."""
TOKEN_KL_PENALTY_NAMES = tuple(name for name in KL_PENALTY_NAMES if name != "full")
"""The names that work on per-token log-probs ``[batch, response_len]`` (all but ``"full"``, which
needs full-vocabulary log-probs): the ones to accept for ``kl_loss_type`` / ``algorithm.kl_penalty``."""


def _token_kl(logprob: torch.Tensor, ref_logprob: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(policy || ref) from the sampled tokens' log-probs (float32 inputs)."""
    log_ratio = logprob - ref_logprob
    if estimator == "k1":
        return log_ratio
    if estimator == "abs":
        return log_ratio.abs()
    if estimator == "k2":
        return 0.5 * log_ratio.square()
    # k3: r - log r - 1 with r = q/p = exp(ref - logprob), unbiased and always >= 0.
    neg_log_ratio = (-log_ratio).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    k3 = torch.exp(neg_log_ratio) - neg_log_ratio - 1.0
    return k3.clamp(-K3_CLAMP, K3_CLAMP)


def kl_penalty_forward(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """The value of the KL estimator ``kl_penalty`` (without ``+``) per token, float32.

    Raises:
        UnsupportedConfigError: unknown estimator name (a ``NotImplementedError``, as verl raises;
            the message lists the valid names).
    """
    logprob, ref_logprob = logprob.float(), ref_logprob.float()
    if kl_penalty == "full":
        return (logprob.exp() * (logprob - ref_logprob)).sum(dim=-1)
    estimator = _KL_ALIASES.get(kl_penalty)
    if estimator is None:
        raise UnsupportedConfigError("kl_penalty", f"unknown KL estimator {kl_penalty!r}; valid names: "
                                     f"{', '.join(KL_PENALTY_NAMES)}")
    return _token_kl(logprob, ref_logprob, estimator)


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """Estimate KL(policy || reference) per token.

    Estimators (Schulman, http://joschu.net/blog/kl-approx.html), with ``log_ratio = logprob - ref``:

    - ``"kl"`` / ``"k1"``: ``log_ratio`` (unbiased, high variance, can be negative).
    - ``"abs"``: ``|log_ratio|``.
    - ``"mse"`` / ``"k2"``: ``0.5 * log_ratio**2``.
    - ``"low_var_kl"`` / ``"k3"``: ``exp(-log_ratio) + log_ratio - 1``, the log-ratio clamped to
      ``[-20, 20]`` before ``exp`` and the result clamped to ``[-10, 10]``.
    - ``"full"``: exact ``sum_v p(v) * (log p(v) - log q(v))`` over the vocabulary; the inputs are
      full-vocabulary log-probs ``[..., vocab]`` and the output drops the last dim (verl raises
      ``NotImplementedError`` for it).
    - ``"<name>+"`` (e.g. ``"k1+"``, ``"k3+"``, ``"low_var_kl+"``): straight-through estimator whose
      forward value is the named estimator and whose gradient is that of k2, which is the unbiased
      gradient of the KL: ``k2 - sg(k2) + sg(named)``.

    Args:
        logprob: policy log-probs, ``[batch, response_len]`` (``[..., vocab]`` for ``"full"``).
        ref_logprob: reference log-probs, same shape as ``logprob``.
        kl_penalty: the estimator name, one of ``KL_PENALTY_NAMES``.

    Returns:
        float32 tensor ``[batch, response_len]`` (``logprob.shape[:-1]`` for ``"full"``).

    Raises:
        ValueError: shape mismatch. ``UnsupportedConfigError`` (a ``ValueError`` and a
        ``NotImplementedError``): unknown estimator name, listing the valid names.
    """
    if logprob.shape != ref_logprob.shape:
        raise ValueError(f"kl_penalty: logprob {tuple(logprob.shape)} and ref_logprob "
                         f"{tuple(ref_logprob.shape)} must have the same shape")
    straight_through = kl_penalty.endswith("+") and kl_penalty[:-1] in _KL_ALIASES
    value = kl_penalty_forward(logprob, ref_logprob, kl_penalty[:-1] if straight_through else kl_penalty)
    if not straight_through:
        return value
    k2 = _token_kl(logprob.float(), ref_logprob.float(), "k2")
    return k2 - k2.detach() + value.detach()


class FixedKLController:
    """A constant KL coefficient.

    Args:
        kl_coef: the coefficient ``beta`` of the KL penalty.
    """

    def __init__(self, kl_coef: float) -> None:
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op: the coefficient stays fixed."""

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


class AdaptiveKLController:
    """Adaptive KL coefficient of Ziegler et al. 2019, "Fine-Tuning Language Models from Human
    Preferences" (arXiv:1909.08593), eq. (2)::

        e = clip(current_kl / target_kl - 1, -0.2, 0.2)
        value <- value * (1 + e * n_steps / horizon)

    Args:
        init_kl_coef: the starting coefficient.
        target_kl: the KL the controller steers towards (> 0).
        horizon: number of samples over which the error is corrected (> 0).
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int) -> None:
        if target_kl <= 0 or horizon <= 0:
            raise ValueError(f"AdaptiveKLController needs target_kl > 0 and horizon > 0, got "
                             f"target_kl={target_kl}, horizon={horizon}")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move ``value`` towards the coefficient that keeps the KL near ``target_kl``.

        Args:
            current_kl: the KL measured on the last batch.
            n_steps: number of samples in that batch.
        """
        proportional_error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + proportional_error * n_steps / self.horizon

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


def get_kl_controller(kl_ctrl: Any) -> FixedKLController | AdaptiveKLController:
    """Build the KL controller of the ``algorithm.kl_ctrl`` config section (``type``, ``kl_coef``,
    ``target_kl``, ``horizon``).

    Raises:
        UnsupportedConfigError: unknown ``type`` (a ``NotImplementedError``, as verl raises).
        ConfigAssertionError: adaptive with ``target_kl <= 0`` or ``horizon <= 0`` (an
            ``AssertionError``, as verl asserts).
    """
    if kl_ctrl.type == "fixed":
        return FixedKLController(kl_coef=kl_ctrl.kl_coef)
    if kl_ctrl.type == "adaptive":
        if kl_ctrl.target_kl <= 0 or kl_ctrl.horizon <= 0:
            raise ConfigAssertionError("algorithm.kl_ctrl", "adaptive KL control needs target_kl > 0 and horizon > 0, "
                                       f"got target_kl={kl_ctrl.target_kl}, horizon={kl_ctrl.horizon}")
        return AdaptiveKLController(kl_ctrl.kl_coef, kl_ctrl.target_kl, kl_ctrl.horizon)
    raise UnsupportedConfigError("algorithm.kl_ctrl.type", f"unknown KL controller {kl_ctrl.type!r}; "
                                 "use 'fixed' or 'adaptive'")
