"""Graceful stop: the first SIGINT/SIGTERM is a request, the second stops at once; the ``rlvr``
command stopped by SIGTERM names its checkpoint and the command that resumes, and that command
finishes the run with the metrics of an uninterrupted run."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from trainer_helpers import tiny_overrides

from rlvr.trainer.graceful_stop import GracefulStop, StopNow
from rlvr.trainer.tracking import read_metrics

REPO = Path(__file__).resolve().parents[2]


def test_first_signal_requests_a_stop_and_the_second_stops_at_once():
    before = signal.getsignal(signal.SIGINT)
    with GracefulStop() as stop:
        assert not stop.requested
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)
        assert stop.requested and stop.signal_name == "SIGTERM"
        with pytest.raises(StopNow, match="SIGINT received twice") as info:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)
        assert info.value.signum == signal.SIGINT and isinstance(info.value, KeyboardInterrupt)
    assert signal.getsignal(signal.SIGINT) is before


def test_outside_the_main_thread_nothing_is_installed():
    seen = []

    def enter() -> None:
        with GracefulStop() as stop:
            seen.append((stop.requested, signal.getsignal(signal.SIGTERM)))

    handler = signal.getsignal(signal.SIGTERM)
    thread = threading.Thread(target=enter)
    thread.start()
    thread.join()
    assert seen == [(False, handler)]


def _metrics_steps(path: Path) -> list[int]:
    return [row["step"] for row in read_metrics(path)] if path.is_file() else []


@pytest.mark.slow  # two training commands in processes of their own
def test_sigterm_stops_the_command_with_a_checkpoint_and_the_printed_command_resumes(
        tiny_model_dir, tiny_data, tmp_path):
    run_dir = tmp_path / "run"
    overrides = tiny_overrides(tiny_model_dir, tiny_data, run_dir, **{
        "trainer.total_training_steps": 6, "trainer.val_before_train": False, "trainer.report": False,
        "trainer.num_threads": 1, "trainer.resume_mode": "disable"})
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "rlvr.trainer.main_ppo", "--preset", "grpo", *overrides]
    process = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while 1 not in _metrics_steps(run_dir / "metrics.jsonl") and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    found = re.search(r"rlvr: stopped by SIGTERM after step (\d+); the checkpoint of step \1 is (\S+)\.\n"
                      r"Resume with:\n  (.+)\n", stderr)
    assert found, stderr[-3000:]
    step, checkpoint, resume = int(found.group(1)), Path(found.group(2)), found.group(3)
    assert 1 <= step < 6 and checkpoint == run_dir / "checkpoints" / f"global_step_{step}"
    assert resume.startswith(f"cd {tmp_path} && {sys.executable} -m rlvr.trainer.main_ppo --preset grpo")
    assert resume.endswith("trainer.resume_mode=auto") and "trainer.resume_mode=disable" not in resume
    assert _metrics_steps(run_dir / "metrics.jsonl") == list(range(1, step + 1))
    subprocess.run(["bash", "-c", resume], cwd=REPO, env=env, check=True, capture_output=True, timeout=300)
    whole = tmp_path / "whole"
    subprocess.run([*command, f"trainer.default_local_dir={whole}"], cwd=tmp_path, env=env, check=True,
                   capture_output=True, timeout=300)
    skip = ("timing", "perf/", "rollout/weights_version")  # the version counts pushes in this process
    rows, reference = read_metrics(run_dir / "metrics.jsonl"), read_metrics(whole / "metrics.jsonl")
    assert [row["step"] for row in rows] == [1, 2, 3, 4, 5, 6, 6]
    assert [{k: v for k, v in r.items() if not k.startswith(skip)} for r in rows] == \
           [{k: v for k, v in r.items() if not k.startswith(skip)} for r in reference]
