"""The ``guess_number`` environment of the ``env_agent`` loop."""

from __future__ import annotations

from typing import Any

from rlvr.agent import register_environment

from guess_number.numbers import last_number


@register_environment("guess_number")
class GuessNumberEnvironment:
    """The model guesses a secret integer (the row's ``reward_model.ground_truth``); after a wrong
    guess it is told "Higher." or "Lower." and guesses again, until it is right or out of turns.

    Args:
        correct_reward: reward of the turn with the right guess.
        wrong_reward: reward of every other turn (a small cost for each extra guess).
    """

    def __init__(self, correct_reward: float = 1.0, wrong_reward: float = -0.1) -> None:
        self.correct_reward, self.wrong_reward = float(correct_reward), float(wrong_reward)
        self.secret = 0

    def reset(self, row: dict[str, Any]) -> str | None:
        self.secret = int(row["reward_model"]["ground_truth"])
        return None  # the prompt already asks for a guess

    def step(self, text: str) -> tuple[str, float, bool, dict[str, Any]]:
        guess = last_number(text)
        if guess is None:
            return "Answer with one number.", self.wrong_reward, False, {"answered": 0.0}
        if guess == self.secret:
            return "", self.correct_reward, True, {"answered": 1.0, "distance": 0.0}
        hint = "Higher." if guess < self.secret else "Lower."
        return hint, self.wrong_reward, False, {"answered": 1.0, "distance": float(abs(guess - self.secret))}
