"""Metric sinks: console, JSONL (``<run dir>/metrics.jsonl``), TensorBoard and Weights & Biases.

TensorBoard and W&B are optional dependencies: asking for them without the package installed is an
error that says what to install.

Validation samples (``trainer.log_val_generations``, :meth:`Tracking.log_generations`) go to every
sink as a table: a W&B table ``val/generations`` (one row per validation, as verl logs it), a
TensorBoard text table, ``<run dir>/val_generations.jsonl`` (one line per sample) and a console table.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rlvr.utils.errors import RlvrError

logger = logging.getLogger(__name__)

CONSOLE_KEYS = (
    ("train/loss", "loss"),
    ("critic/score/mean", "score"),
    ("train/acc", "acc"),
    ("train/unfiltered_acc", "acc_all"),
    ("actor/kl_loss", "kl"),
    ("actor/reward_kl_penalty", "kl_reward"),
    ("actor/entropy", "entropy"),
    ("actor/grad_norm", "grad"),
    ("response_length/mean", "len"),
    ("timing_s/step", "s/step"),
    ("perf/throughput", "tok/s/worker"),
)

Generation = tuple[str, str, float]
"""One logged validation sample: ``(input, output, score)``."""

CONSOLE_TEXT_CHARS = 60
"""Characters of an input or output shown in the console's sample table."""


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def _clip(text: str, width: int = CONSOLE_TEXT_CHARS) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= width else flat[: width - 3] + "..."


class ConsoleLogger:
    """One line per step with the main metrics; validation metrics in full.

    Args:
        write: where lines go (``tqdm.write`` keeps a progress bar intact).
    """

    def __init__(self, write: Callable[[str], None] = print) -> None:
        self.write = write

    def log(self, data: dict[str, float], step: int) -> None:
        parts = [f"step {step}"]
        parts += [f"{short}={_fmt(data[key])}" for key, short in CONSOLE_KEYS if key in data]
        parts += [f"{key}={_fmt(value)}" for key, value in sorted(data.items()) if key.startswith("val/")]
        self.write(" | ".join(parts))

    def log_generations(self, samples: Sequence[Generation], step: int) -> None:
        """A table of the samples: score, input and output, each cut to one short line."""
        self.write(f"validation samples at step {step}:")
        self.write(f"  {'score':>7} | {'input':<{CONSOLE_TEXT_CHARS}} | output")
        for text_in, text_out, score in samples:
            self.write(f"  {_fmt(score):>7} | {_clip(text_in):<{CONSOLE_TEXT_CHARS}} | {_clip(text_out)}")

    def rewind(self, step: int) -> None:
        """Printed lines stay printed."""

    def finish(self) -> None:
        """Nothing to close."""


class JsonlLogger:
    """Appends ``{"step": k, ...metrics}`` per call to ``<run dir>/metrics.jsonl``.

    Args:
        path: the JSONL file.
        resume_step: when resuming from step k, lines with a step > k (written after that
            checkpoint by the interrupted run) are removed first.
    """

    def __init__(self, path: str | os.PathLike, resume_step: int | None = None) -> None:
        self.path = Path(path)
        self.generations_path = self.path.with_name("val_generations.jsonl")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for file in (self.path, self.generations_path):
            if resume_step is None:
                file.write_text("")
            elif file.exists():
                _keep_up_to(file, resume_step)
        self._file = self.path.open("a", encoding="utf-8")

    def rewind(self, step: int) -> None:
        """Remove the rows after ``step`` (training went back to that step's checkpoint)."""
        self._file.close()
        for file in (self.path, self.generations_path):
            if file.exists():
                _keep_up_to(file, step)
        self._file = self.path.open("a", encoding="utf-8")

    def log(self, data: dict[str, float], step: int) -> None:
        row = {"step": step, **{k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                                for k, v in data.items()}}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()

    def log_generations(self, samples: Sequence[Generation], step: int) -> None:
        """One line ``{"step", "input", "output", "score"}`` per sample in ``val_generations.jsonl``."""
        with self.generations_path.open("a", encoding="utf-8") as f:
            for text_in, text_out, score in samples:
                f.write(json.dumps({"step": step, "input": text_in, "output": text_out, "score": score},
                                   ensure_ascii=False) + "\n")

    def finish(self) -> None:
        self._file.close()


def _keep_up_to(path: Path, step: int) -> None:
    """Keep the rows of a JSONL file of ``{"step": ...}`` rows whose step is at most ``step``."""
    kept = [line for line in read_metrics(path) if line["step"] <= step]
    path.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in kept), encoding="utf-8")


class TensorboardLogger:
    """Scalars to a TensorBoard event file in ``<run dir>/tensorboard``."""

    def __init__(self, log_dir: str | os.PathLike) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:
            raise RlvrError("the tensorboard logger needs the `tensorboard` package: `pip install tensorboard` "
                            "(or `pip install rlvr[tensorboard]`), or remove it from trainer.logger") from err
        self.writer = SummaryWriter(log_dir=str(log_dir))

    def log(self, data: dict[str, float], step: int) -> None:
        for key, value in data.items():
            self.writer.add_scalar(key, value, step)

    def log_generations(self, samples: Sequence[Generation], step: int) -> None:
        """A markdown table under ``val/generations`` (TensorBoard's text tab)."""
        rows = ["| input | output | score |", "|---|---|---|"]
        rows += [f"| {_markdown_cell(text_in)} | {_markdown_cell(text_out)} | {_fmt(score)} |"
                 for text_in, text_out, score in samples]
        self.writer.add_text("val/generations", "\n".join(rows), step)

    def rewind(self, step: int) -> None:
        """Event files are append-only: TensorBoard shows the redone steps as a second set of points."""

    def finish(self) -> None:
        self.writer.close()


class WandbLogger:
    """Weights & Biases run named ``<project>/<experiment>``, config attached."""

    def __init__(self, project: str, experiment: str, config: dict[str, Any], run_dir: str | os.PathLike) -> None:
        try:
            import wandb
        except ImportError as err:
            raise RlvrError("the wandb logger needs the `wandb` package: `pip install wandb` "
                            "(or `pip install rlvr[wandb]`), or remove it from trainer.logger") from err
        self.wandb = wandb
        self.run = wandb.init(project=project, name=experiment, config=config, dir=str(run_dir))
        self.generation_rows: list[list[Any]] = []

    def log(self, data: dict[str, float], step: int) -> None:
        self.run.log(data, step=step)

    def log_generations(self, samples: Sequence[Generation], step: int) -> None:
        """The table ``val/generations``: one row per validation (``step``, then ``input_i``,
        ``output_i``, ``score_i`` of each sample), the earlier validations' rows kept above it (a
        new table object each time: W&B does not show rows added to a table already logged)."""
        columns = ["step"] + [f"{field}_{i + 1}" for i in range(len(samples)) for field in ("input", "output", "score")]
        self.generation_rows.append([step] + [value for sample in samples for value in sample])
        rows = [row for row in self.generation_rows if len(row) == len(columns)]
        self.run.log({"val/generations": self.wandb.Table(columns=columns, data=rows)}, step=step)

    def rewind(self, step: int) -> None:
        """A W&B run only moves forward: it drops the redone steps up to the step reached before."""

    def finish(self) -> None:
        self.run.finish()


class Tracking:
    """Fan metrics out to the configured sinks (``trainer.logger``).

    Args:
        project_name: project (W&B project).
        experiment_name: run name.
        default_backend: sink names among ``console``, ``jsonl``, ``tensorboard``, ``wandb``.
        run_dir: directory of the run (JSONL file, TensorBoard events).
        config: the run config as a plain dict (for W&B).
        resume_step: see :class:`JsonlLogger`.
        console_write: line writer of the console sink.
    """

    def __init__(self, project_name: str, experiment_name: str, default_backend: Sequence[str],
                 run_dir: str | os.PathLike, config: dict[str, Any] | None = None,
                 resume_step: int | None = None, console_write: Callable[[str], None] = print) -> None:
        run_dir = Path(run_dir)
        factories: dict[str, Callable[[], Any]] = {
            "console": lambda: ConsoleLogger(console_write),
            "jsonl": lambda: JsonlLogger(run_dir / "metrics.jsonl", resume_step),
            "tensorboard": lambda: TensorboardLogger(run_dir / "tensorboard"),
            "wandb": lambda: WandbLogger(project_name, experiment_name, config or {}, run_dir),
        }
        unknown = [name for name in default_backend if name not in factories]
        if unknown:
            raise RlvrError(f"unknown logger(s) {unknown}; trainer.logger takes {', '.join(factories)}")
        self.loggers = {name: factories[name]() for name in default_backend}

    def log(self, data: dict[str, float], step: int) -> None:
        """Send ``data`` (name -> float) for ``step`` to every sink."""
        for logger in self.loggers.values():
            logger.log(data, step)

    def log_generations(self, samples: Sequence[Generation], step: int) -> None:
        """Send the validation samples ``[(input, output, score)]`` of ``step`` to every sink as a table."""
        if not samples:
            return
        for logger in self.loggers.values():
            logger.log_generations(samples, step)

    def rewind(self, step: int) -> None:
        """Training went back to the checkpoint of ``step``: sinks that can, forget the later rows."""
        for logger in self.loggers.values():
            logger.rewind(step)

    def finish(self) -> None:
        for logger in self.loggers.values():
            logger.finish()


def _markdown_cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl`` file; a last line cut short (the process was killed while
    writing it) is left out with a warning."""
    lines = [line for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    rows = [json.loads(line) for line in lines[:-1]]
    if lines:
        try:
            rows.append(json.loads(lines[-1]))
        except json.JSONDecodeError:
            logger.warning("%s: the last line is incomplete and is left out: %.80s", path, lines[-1])
    return rows
