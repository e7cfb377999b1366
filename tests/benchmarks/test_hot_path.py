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
    entry = entry_from(results, "abc123", True, 2.5, 2, "note")
    assert entry["workload"] == WORK and entry["commit"] == "abc123" and entry["dirty"]
    assert entry["busy"] is True  # load 2.5 on 2 cores
    assert (entry["ratio"], entry["ratio_pairwise"], entry["rlvr_stages_s"]["generation"]) == (0.1235, 0.1211, 0.412)
    assert entry_from(results, "abc123", False, 1.5, 2, "")["busy"] is False


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
