"""The ``guess_reward`` reward manager."""

from __future__ import annotations

from typing import Any

from rlvr.reward.decode import DecodedBatch
from rlvr.reward.managers import RewardManagerBase, register
from rlvr.reward.managers.base import RewardBook

from guess_number.numbers import last_number


def closeness(text: str, ground_truth: Any, span: float = 8.0) -> dict[str, float]:
    """The score of one response: 1 when its last number is the secret, else
    ``max(0, 1 - |guess - secret| / span)``, 0 without a number; ``acc`` 1 for the right guess."""
    guess, secret = last_number(text), int(ground_truth)
    score = 0.0 if guess is None else max(0.0, 1.0 - abs(guess - secret) / span)
    return {"score": score, "acc": float(guess == secret)}


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None,
                  span: float = 8.0) -> dict[str, float]:
    """The same rule as a plain scorer, for rlvr's own reward managers:
    ``custom_reward_function.path=guess_number/reward.py`` (this module is not run a second time
    when ``trainer.user_modules`` imported it already)."""
    return closeness(solution_str, ground_truth, span)


@register("guess_reward")
class GuessRewardManager(RewardManagerBase):
    """Scores the final guess of each response (its last number) with :func:`closeness`; the
    environment's and the tool's rewards come on top (the trainer adds them).

    Args:
        span: how far off a guess may be and still score (``reward_model.reward_kwargs.span``).
        (tokenizer, num_examine, compute_score, reward_fn_key and the keyword-only error policy as
        in :class:`~rlvr.reward.managers.base.RewardManagerBase`)
    """

    def __init__(self, tokenizer: Any, num_examine: int, compute_score: Any = None, reward_fn_key: str = "data_source",
                 span: float = 8.0, **kwargs: Any) -> None:
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key, **kwargs)
        self.span = float(span)

    def _score(self, decoded: DecodedBatch, book: RewardBook) -> dict[str, float]:
        for i, text in enumerate(decoded.responses):
            book.record(i, closeness(text, decoded.ground_truths[i], self.span))
        return {}
