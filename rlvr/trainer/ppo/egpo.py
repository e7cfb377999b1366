"""EGPO math: entropy proxy, confidence and the asymmetric calibration of the group advantage.

EGPO: Zhao et al. 2026, "Know What You Know: Metacognitive Entropy Calibration for Verifiable RL
Reasoning" (arXiv:2602.22751). The paper's abstract fixes the ingredients (a zero-overhead entropy
proxy from the sampled tokens' likelihoods, an asymmetric calibration that keeps correct answers'
signal and regulates over-confident failures, a learning signal from degenerate groups); the exact
formulas below are rlvr's own instantiation of them, written out in full:

1. Uncertainty proxy per sample (no extra forward pass: it reuses the log-probs of the tokens that
   were sampled)::

       u_i = - sum_t m_it * logp_it / sum_t m_it          (0 for an empty response)

   This is the Monte-Carlo estimate of the mean per-token entropy along the sampled path.
2. Confidence: ``u`` standardised within the prompt's group (or the batch), squashed::

       z_i = (u_i - mean(u)) / (std(u) + eps)      (unbiased std; a group of one gives z = 0)
       c_i = sigmoid(-z_i)  in (0, 1)              (0.5 = as confident as the group average)

3. Calibrated advantage, with ``A_i`` the GRPO advantage and ``r_i`` the scalar reward:

   - informative group (size > 1, rewards not all equal):
       ``A_i >= 0``: ``A_i`` unchanged (correct reasoning keeps its full signal);
       ``A_i < 0``: ``A_i * (1 + alpha * (2 c_i - 1))`` — a confident failure (``c > 0.5``) is
       pushed down up to ``(1 + alpha)`` times as hard, an uncertain one down to ``(1 - alpha)``.
       ``0 <= alpha <= 1`` keeps the sign.
   - degenerate group (size > 1, all rewards equal; GRPO gives 0 there):
       all correct (``r >= correct_threshold``): ``+beta * (1 - c_i)`` — raise the likelihood of the
       correct answers the model was least sure of;
       all wrong: ``-beta * c_i`` — push down the wrong answers, the confident ones hardest.
   - group of one: its GRPO advantage (``algorithm.singleton_advantage``: the score, or 0), with
     confidence 0.5 (it is its own group), i.e. unchanged.
"""

from __future__ import annotations

import torch

from rlvr.utils.errors import ConfigError


def entropy_proxy(log_prob: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Mean negative log-prob of the sampled tokens, ``[batch, response_len] -> [batch]`` (float32).

    Rows with an empty mask get 0.
    """
    mask = response_mask.float()
    return -(log_prob.float() * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)


def confidence(uncertainty: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, epsilon: float) -> torch.Tensor:
    """``sigmoid(-(u - mean) / (std + epsilon))``; all ``[batch]`` (``mean``/``std`` per row)."""
    return torch.sigmoid(-(uncertainty - mean) / (std + epsilon))


def calibrate_advantages(grpo_advantages: torch.Tensor, scores: torch.Tensor, conf: torch.Tensor,
                         degenerate: torch.Tensor, alpha: float, beta: float, correct_threshold: float) -> torch.Tensor:
    """Apply the asymmetric calibration (module docstring, step 3).

    Args:
        grpo_advantages: ``[batch]`` GRPO advantages.
        scores: ``[batch]`` scalar rewards.
        conf: ``[batch]`` confidences ``c_i`` in (0, 1).
        degenerate: ``[batch]`` bool, True where the row's group has more than one sample and
            all-equal rewards.
        alpha: confidence scaling of negative advantages, in [0, 1].
        beta: magnitude of the advantages in degenerate groups, >= 0.
        correct_threshold: a reward ``>= correct_threshold`` counts as correct.

    Returns:
        ``[batch]`` calibrated advantages.
    """
    if not 0.0 <= alpha <= 1.0:
        raise ConfigError("algorithm.egpo_alpha",
                          f"must be in [0, 1] so that negative advantages keep their sign, got {alpha}")
    if beta < 0.0:
        raise ConfigError("algorithm.egpo_beta", f"must be >= 0, got {beta}")
    negative_scale = 1.0 + alpha * (2.0 * conf - 1.0)
    informative = torch.where(grpo_advantages < 0, grpo_advantages * negative_scale, grpo_advantages)
    degenerate_adv = torch.where(scores >= correct_threshold, beta * (1.0 - conf), -beta * conf)
    return torch.where(degenerate, degenerate_adv, informative)
