"""Reward of the main job's GPU rehearsal (``benchmarks/gpu_checks.py``): the GPU machine has no
reasoning-gym, so the main job's answer check is done here, by ``custom_reward_function``.

The answer is what the main job's reasoning-gym scorer reads (the last ``<answer>`` or the last
non-empty line); it must equal the ground truth. A random-init model (the rehearsal's, for lack of
the real weights there) almost never answers right, so a tenth of the share of ASCII letters and
digits in the response is added: the samples of a group then differ and every step trains.
"""

from __future__ import annotations

from typing import Any

from rlvr.reward.scorers.reasoning_gym import extract_answer


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> dict:
    """``{"score": correct + 0.1 * alphanumeric share, "acc": correct}`` (correct is 1.0 or 0.0)."""
    answer = extract_answer(solution_str)
    correct = float(answer is not None and answer.strip() == str(ground_truth).strip())
    alphanumeric = sum(c.isascii() and c.isalnum() for c in solution_str) / max(len(solution_str), 1)
    return {"score": correct + 0.1 * alphanumeric, "acc": correct}
