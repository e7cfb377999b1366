"""A training progress bar with ETA (tqdm), which also respects the wall-time budget."""

from __future__ import annotations

import time

from tqdm import tqdm


class TrainingProgress:
    """Steps done / total with ETA, the main metrics in the postfix, and the time budget.

    Args:
        total_steps: the last step of the run.
        start_step: steps already done (after a resume).
        max_time_s: wall-time budget of the training loop (None = no budget).
        enabled: draw the bar (the budget is enforced either way).
    """

    def __init__(self, total_steps: int, start_step: int, max_time_s: float | None, enabled: bool) -> None:
        self.total_steps = total_steps
        self.start_step = start_step
        self.max_time_s = max_time_s
        self.start = time.monotonic()
        self.step_times: list[float] = []
        self.bar = tqdm(total=total_steps, initial=start_step, desc="training", unit="step",
                        dynamic_ncols=True, disable=not enabled)

    def elapsed_s(self) -> float:
        return time.monotonic() - self.start

    def restart_clock(self) -> None:
        """Start the time budget now (after the validation before training, which is not training)."""
        self.start = time.monotonic()

    def update(self, step_time_s: float, metrics: dict[str, float]) -> None:
        """Advance one step; show reward, accuracy and step time."""
        self.step_times.append(step_time_s)
        postfix = {"s/step": f"{step_time_s:.1f}"}
        for key, short in (("critic/score/mean", "score"), ("train/acc", "acc")):
            if key in metrics:
                postfix[short] = f"{metrics[key]:.3f}"
        self.bar.set_postfix(postfix, refresh=False)
        self.bar.total = self.expected_last_step()
        self.bar.update(1)

    def expected_last_step(self) -> int:
        """The step the run will end at: the configured last step, or earlier when the time budget
        (at the mean step time so far) runs out first; the bar's total, so its ETA is honest."""
        if self.max_time_s is None or not self.step_times:
            return self.total_steps
        steps_left = int(max(self.max_time_s - self.elapsed_s(), 0.0) // self.mean_step_s())
        return min(self.total_steps, self.start_step + len(self.step_times) + steps_left)

    def out_of_time(self) -> bool:
        """True when another step (as long as the average so far) would overrun ``max_time_s``."""
        if self.max_time_s is None:
            return False
        return self.elapsed_s() + self.mean_step_s() > self.max_time_s

    def mean_step_s(self) -> float:
        """Mean wall time of the steps so far (0 before the first)."""
        return sum(self.step_times) / len(self.step_times) if self.step_times else 0.0

    def rewind(self, step: int) -> None:
        """Training went back to ``step`` (a restart restored its checkpoint); the time budget keeps
        counting the wall time spent."""
        self.bar.n = step
        self.bar.refresh()

    def write(self, line: str) -> None:
        """Print a line above the bar."""
        tqdm.write(line)

    def close(self) -> None:
        self.bar.close()
