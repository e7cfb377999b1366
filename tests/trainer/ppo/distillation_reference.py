"""Reference implementations of verl 0.9's on-policy distillation losses, used only by the tests.

Written from verl's documented formulas (``DistillationLossConfig`` and its loss modes) with plain
Python loops over float64 scalars; nothing is shared with rlvr's torch code. Inputs are nested
lists: ``[batch][response_len]`` per token, ``[batch][response_len][k]`` for the top-k.
"""

from __future__ import annotations

import math


def _clip(x, lo, hi):
    return min(max(x, lo), hi)


def estimator(student, teacher, mode):
    """Single-sample estimate of KL(student || teacher) at one sampled token; ``student`` and
    ``teacher`` are that token's log-probs."""
    if mode in ("kl", "k1"):
        return student - teacher
    if mode == "abs":
        return abs(student - teacher)
    if mode in ("mse", "k2"):
        return 0.5 * (student - teacher) ** 2
    if mode in ("k3", "low_var_kl"):  # exp(q - s) - (q - s) - 1, q - s clamped to +-20, the value to +-10
        delta = _clip(teacher - student, -20.0, 20.0)
        return _clip(math.exp(delta) - delta - 1.0, -10.0, 10.0)
    raise ValueError(mode)


def forward_kl_topk(student_topk, teacher_topk, log_prob_min_clamp=None):
    """``(loss, student_mass, teacher_mass)`` at one position: sum over the teacher's top-k tokens of
    ``p_teacher * (log p_teacher - log p_student)``, the log-probs clamped from below first, the
    result clamped at 0; the masses are the top-k probabilities summed before the clamp."""
    student_mass = sum(math.exp(s) for s in student_topk)
    teacher_mass = sum(math.exp(t) for t in teacher_topk)
    if log_prob_min_clamp is not None:
        student_topk = [max(s, log_prob_min_clamp) for s in student_topk]
        teacher_topk = [max(t, log_prob_min_clamp) for t in teacher_topk]
    loss = sum(math.exp(t) * (t - s) for s, t in zip(student_topk, teacher_topk))
    return max(loss, 0.0), student_mass, teacher_mass


def token_losses(mode, student, teacher, loss_max_clamp=None, log_prob_min_clamp=None):
    """Per-token losses ``[batch][response_len]`` of ``mode``: estimator losses from the sampled
    tokens' log-probs, ``forward_kl_topk`` from the top-k lists; clamped to +-``loss_max_clamp``."""
    out = []
    for s_row, t_row in zip(student, teacher):
        row = []
        for s, t in zip(s_row, t_row):
            value = forward_kl_topk(s, t, log_prob_min_clamp)[0] if mode == "forward_kl_topk" else estimator(s, t, mode)
            if loss_max_clamp is not None:
                value = _clip(value, -loss_max_clamp, loss_max_clamp)
            row.append(value)
        out.append(row)
    return out


def total_loss(policy_loss, distill_loss, use_task_rewards, coef):
    """verl's combination: ``policy + coef * distill`` with task rewards, else ``distill`` alone."""
    return policy_loss + coef * distill_loss if use_task_rewards else distill_loss
