"""The hot-path guard's bookkeeping (``benchmarks/hot_path.py``): the history entry, the baseline of
idle runs on the same machine and workload, and the verdict with the stages that grew."""

from __future__ import annotations

import json

import pytest

from benchmarks.hot_path import baseline, entry_from, read_history, verdict

MACHINE, WORK = "2 CPU cores, 24 GiB RAM", "tiny 8x8x32"


def _entry(ratio: float, generation: float = 0.3, update: float = 0.6, trl: float = 8.0, busy: bool = False,
           machine: str = MACHINE, workload: str = WORK, commit: str = "c") -> dict:
    return {"machine": machine, "workload": workload, "busy": busy, "load_1m": 3.0 if busy else 0.2,
            "ratio_pairwise": ratio, "trl_s": trl, "commit": commit,
            "rlvr_stages_s": {"generation": generation, "update": update}}


def test_entry_from_a_benchmark_result():
    results = {"workload": {"name": "tiny", "prompts": 8, "samples": 8, "response_len": 32}, "machine": MACHINE,
               "ratio_rlvr_over_trl": 0.12345, "ratio_pairwise_median": 0.1211, "ratio_cpu": 0.14,
               "rlvr": {"median_s": 1.0, "stages_median_s": {"generation": 0.41234, "update": 0.5}},
               "trl": {"median_s": 8.1}, "versions": {"torch": "2.13.0+cpu"}}
    entry = entry_from(results, "abc123", True, 0.3, 0.8, "note")
    assert entry["workload"] == WORK and entry["commit"] == "abc123" and entry["dirty"]
    assert entry["busy"] is True and entry["busy_cores"] == 0.8  # others used 0.8 cores before it started
    assert (entry["ratio"], entry["ratio_pairwise"], entry["rlvr_stages_s"]["generation"]) == (0.1235, 0.1211, 0.412)
    # a high load average left by a run that has just ended does not make the machine busy
    assert entry_from(results, "abc123", False, 2.5, 0.1, "")["busy"] is False


def test_baseline_is_the_median_of_the_last_idle_runs_of_the_same_machine_and_workload():
    history = [_entry(0.50, commit="old"), _entry(0.10, commit="a"), _entry(0.12, commit="b"),
               _entry(0.90, busy=True), _entry(0.11, commit="d"), _entry(0.70, machine="other"),
               _entry(0.80, workload="tiny 8x8x64")]
    base = baseline(history, MACHINE, WORK, runs=3)
    assert base["ratio_pairwise"] == 0.11 and base["commits"] == ["a", "b", "d"] and base["entries"] == 3
    assert base["stage_share"] == {"generation": pytest.approx(0.3 / 8), "update": pytest.approx(0.6 / 8)}
    assert baseline(history, "a GPU", WORK, runs=3) is None


def test_verdict_passes_within_tolerance_and_names_the_stage_that_grew():
    base = baseline([_entry(0.10), _entry(0.10)], MACHINE, WORK, runs=5)
    ok, message = verdict(_entry(0.114), base, tolerance=0.15)
    assert ok and message.startswith("ok: ratio 0.114 against the baseline 0.100") and "limit 0.115" in message
    ok, message = verdict(_entry(0.13, generation=0.6), base, tolerance=0.15)
    assert not ok and "grown: generation 0.0375 -> 0.0750 of TRL's step" in message and "update" not in message


def test_verdict_does_not_judge_a_busy_run_or_one_without_baseline():
    assert verdict(_entry(0.9, busy=True), baseline([_entry(0.1)], MACHINE, WORK, 5), 0.15)[0]
    ok, message = verdict(_entry(0.9), None, 0.15)
    assert ok and "starts one" in message


def test_read_history(tmp_path):
    path = tmp_path / "h.jsonl"
    assert read_history(path) == []
    path.write_text(json.dumps(_entry(0.1)) + "\n\n" + json.dumps(_entry(0.2)) + "\n")
    assert [e["ratio_pairwise"] for e in read_history(path)] == [0.1, 0.2]


def test_a_recorded_run_does_not_make_the_tree_dirty(tmp_path):
    """Each run appends to the tracked history file; only other changes make the next entry dirty."""
    import subprocess

    from benchmarks.hot_path import HISTORY_IN_REPO, git_commit

    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    history, code = tmp_path / HISTORY_IN_REPO, tmp_path / "rlvr.py"
    history.parent.mkdir(parents=True)
    history.write_text("{}\n")
    code.write_text("x = 1\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "start")
    history.write_text("{}\n{}\n")
    commit, dirty = git_commit(tmp_path)
    assert len(commit) == 12 and not dirty
    code.write_text("x = 2\n")
    assert git_commit(tmp_path) == (commit, True)
