"""Metric sinks (console, JSONL with resume truncation, optional backends) and the end-of-run report."""

from __future__ import annotations

import importlib.util
import logging
import math

import pytest

from rlvr.trainer.progress import TrainingProgress
from rlvr.trainer.report import generations_table, metric_summary, write_report
from rlvr.trainer.tracking import ConsoleLogger, JsonlLogger, Tracking, read_metrics
from rlvr.utils.errors import RlvrError


def test_jsonl_logger_writes_rows_and_truncates_on_resume(tmp_path):
    path = tmp_path / "metrics.jsonl"
    logger = JsonlLogger(path)
    for step in (1, 2, 3):
        logger.log({"a": float(step), "bad": math.nan}, step)
    logger.finish()
    assert read_metrics(path) == [{"step": s, "a": float(s), "bad": None} for s in (1, 2, 3)]
    resumed = JsonlLogger(path, resume_step=2)  # step 3 was logged after the step-2 checkpoint
    resumed.log({"a": 30.0}, 3)
    resumed.finish()
    assert [row["a"] for row in read_metrics(path)] == [1.0, 2.0, 30.0]


def test_jsonl_rewind_and_a_line_cut_short(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    tracking = Tracking("p", "e", ["console", "jsonl"], tmp_path, console_write=lambda line: None)
    for step in (1, 2, 3):
        tracking.log({"a": float(step)}, step)
    tracking.rewind(1)  # training went back to the step-1 checkpoint
    tracking.log({"a": 20.0}, 2)
    tracking.finish()
    assert read_metrics(path) == [{"step": 1, "a": 1.0}, {"step": 2, "a": 20.0}]
    with path.open("a") as f:
        f.write('{"step": 3, "a"')  # the process was killed while writing
    with caplog.at_level(logging.WARNING):
        assert [row["step"] for row in read_metrics(path)] == [1, 2]
    assert "the last line is incomplete and is left out" in caplog.text


def test_console_logger_line():
    lines = []
    ConsoleLogger(lines.append).log({"critic/score/mean": 0.51234, "train/acc": 0.25, "timing_s/step": 3.0,
                                     "val/x/acc": 0.5, "other": 1.0}, step=4)
    assert lines == ["step 4 | score=0.5123 | acc=0.25 | s/step=3 | val/x/acc=0.5"]


def test_tracking_fans_out_and_rejects_unknown(tmp_path):
    lines = []
    tracking = Tracking("p", "e", ["console", "jsonl"], tmp_path, console_write=lines.append)
    tracking.log({"train/acc": 1.0}, step=1)
    tracking.finish()
    assert lines == ["step 1 | acc=1"]
    assert read_metrics(tmp_path / "metrics.jsonl") == [{"step": 1, "train/acc": 1.0}]
    with pytest.raises(RlvrError, match="unknown logger"):
        Tracking("p", "e", ["mlflow"], tmp_path)


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is not None, reason="tensorboard is installed")
def test_tensorboard_missing_says_what_to_install(tmp_path):
    with pytest.raises(RlvrError, match="pip install tensorboard"):
        Tracking("p", "e", ["tensorboard"], tmp_path)


def test_report_writes_plots_and_generation_table(tmp_path):
    rows = [{"step": 0, "val/acc": 0.2, "val/src/acc": 0.2}]
    rows += [{"step": s, "critic/score/mean": 0.1 * s, "train/acc": 0.1 * s, "actor/entropy": 1.0,
              "response_length/mean": 5.0, "timing_s/step": 2.0} for s in (1, 2, 3)]
    rows += [{"step": 3, "val/acc": 0.6, "val/src/acc": 0.6}]
    gens = [{"step": 0, "prompt": "1+1=", "response": "2 | x\nok", "ground_truth": "2", "score": 1.0}]
    path = write_report(tmp_path, rows, gens, {"val/acc before": 0.2, "steps": 3})
    text = path.read_text()
    for name in ("reward", "accuracy", "val_accuracy", "entropy", "response_length", "step_time"):
        assert (tmp_path / "plots" / f"{name}.png").stat().st_size > 1000
        assert f"![{name}](plots/{name}.png)" in text
    assert not (tmp_path / "plots" / "kl.png").exists()  # no KL metric was logged
    assert "| val/acc before | 0.2 |" in text and "| steps | 3 |" in text
    assert "| 0 | 1+1= | 2 &#124; x<br>ok | 2 | 1.000 |" in generations_table(gens)


def test_progress_time_budget():
    progress = TrainingProgress(total_steps=10, start_step=0, max_time_s=100.0, enabled=False)
    assert not progress.out_of_time()
    progress.start -= 60.0
    progress.update(30.0, {})
    assert not progress.out_of_time()  # 60 s elapsed + a 30 s step fits in 100 s
    progress.update(60.0, {})
    assert progress.out_of_time()  # 60 s + the 45 s mean step would overrun 100 s
    progress.restart_clock()  # e.g. after the validation before training
    assert not progress.out_of_time() and progress.elapsed_s() < 1.0
    progress.close()


def test_progress_total_follows_the_time_budget():
    progress = TrainingProgress(total_steps=1000, start_step=4, max_time_s=100.0, enabled=False)
    assert progress.expected_last_step() == 1000  # no step timed yet
    progress.start -= 30.0
    progress.update(20.0, {})
    # 30 s elapsed, 70 s left at 20 s per step: 3 more steps after the 5th
    assert progress.expected_last_step() == 8
    assert progress.bar.total == 8
    unlimited = TrainingProgress(total_steps=12, start_step=0, max_time_s=None, enabled=False)
    unlimited.update(5.0, {})
    assert unlimited.expected_last_step() == 12
    progress.close()
    unlimited.close()


def test_metric_summary_shows_accuracy_and_tool_use_before_and_after():
    rows = [{"step": 0, "val/acc": 0.28, "val/agent/tool_use_rate": 0.28, "val/agent/correct_with_tool": 1.0},
            {"step": 1, "timing_s/step": 40.0}, {"step": 2, "timing_s/step": 60.0},
            {"step": 2, "val/acc": 0.7, "val/agent/tool_use_rate": 0.75, "val/agent/correct_with_tool": 1.0}]
    assert metric_summary(rows) == {
        "val/acc before (step 0)": 0.28, "val/acc after (step 2)": 0.7, "val/acc by step": "0: 0.28, 2: 0.70",
        "val/agent/tool_use_rate before (step 0)": 0.28, "val/agent/tool_use_rate after (step 2)": 0.75,
        "val/agent/correct_with_tool before (step 0)": 1.0, "val/agent/correct_with_tool after (step 2)": 1.0,
        "mean step time (s)": 50.0}
    assert metric_summary([{"step": 0, "val/acc": 0.5}]) == {"val/acc before (step 0)": 0.5, "val/acc after (step 0)": 0.5,
                                                            "val/acc by step": "0: 0.50"}


class _FakeWandb:
    """Stands in for the ``wandb`` package: records tables and logged rows (W&B is not installed here)."""

    class Table:
        def __init__(self, columns, data):
            self.columns, self.data = list(columns), [list(row) for row in data]

    def __init__(self):
        self.logged = []

    def init(self, **kwargs):
        return self

    def log(self, data, step):
        self.logged.append((step, data))

    def finish(self):
        pass


def test_validation_samples_go_to_every_logger_as_a_table(tmp_path, monkeypatch):
    fake = _FakeWandb()
    monkeypatch.setitem(__import__("sys").modules, "wandb", fake)
    lines = []
    tracking = Tracking("p", "e", ["console", "jsonl", "wandb"], tmp_path, console_write=lines.append)
    tracking.log_generations([("say 1", "1 | x", 1.0), ("say 2", "two", 0.0)], step=0)
    tracking.log_generations([("say 1", "one", 0.5), ("say 2", "2", 1.0)], step=5)
    tracking.rewind(0)  # training went back: the step-5 samples are forgotten by the JSONL sink
    tracking.finish()
    step, data = fake.logged[-1]
    table = data["val/generations"]
    assert step == 5 and table.columns == ["step", "input_1", "output_1", "score_1", "input_2", "output_2", "score_2"]
    assert table.data == [[0, "say 1", "1 | x", 1.0, "say 2", "two", 0.0], [5, "say 1", "one", 0.5, "say 2", "2", 1.0]]
    assert read_metrics(tmp_path / "val_generations.jsonl") == [
        {"step": 0, "input": "say 1", "output": "1 | x", "score": 1.0},
        {"step": 0, "input": "say 2", "output": "two", "score": 0.0}]
    assert lines[0] == "validation samples at step 0:" and lines[2].split("|")[0].strip() == "1"
    assert "say 2" in lines[3] and lines[3].rstrip().endswith("two")
