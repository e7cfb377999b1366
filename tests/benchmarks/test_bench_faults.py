"""Helpers of the fault-injection benchmark: a reproducible plan inside the run, the totals."""

from __future__ import annotations

import threading

from benchmarks.bench_faults import Plan, _kill_a_worker_later, comparable, plan_faults, summarize


def test_the_plan_is_reproducible_and_every_fault_falls_inside_the_run():
    plans = plan_faults(runs=40, steps=8, save_freq=2, step_s=10.0, seed=0)
    assert plans == plan_faults(runs=40, steps=8, save_freq=2, step_s=10.0, seed=0)
    assert {p.kind for p in plans} == {"kill", "segfault", "hang", "external"}
    for plan in plans:
        if plan.kind == "external":
            assert 1 <= plan.after_step <= 7 and 0.0 <= plan.delay_s <= 8.0  # before the last step ends
        elif plan.method == "save_checkpoint":
            assert 1 <= plan.call <= 3  # saves at steps 2, 4 and 6 inside the loop
        else:
            assert 1 <= plan.call <= 8 and plan.rank in (0, 1)


def test_summary_counts_and_comparable_rows():
    runs = [{"injected": True, "completed": True, "exact": True, "recovery_s": [10.0, 20.0], "steps_redone": 3},
            {"injected": False, "completed": True, "exact": True, "recovery_s": [], "steps_redone": 0},
            {"injected": True, "completed": False, "exact": False, "recovery_s": [30.0], "steps_redone": 1}]
    assert summarize(runs) == {"runs": 3, "faults injected": 2, "runs completed": 2,
                               "runs with the reference metrics": 2, "restarts": 3, "steps redone": 4,
                               "recovery s (median)": 20.0, "recovery s (max)": 30.0}
    row = {"step": 1, "a": 1.0, "timing_s/step": 2.0, "perf/throughput": 3.0, "trainer/restarts": 1.0}
    assert comparable([row]) == [{"step": 1, "a": 1.0}]


def test_an_outside_kill_waits_for_its_step_and_gives_up_when_the_run_ends(tmp_path):
    """The killer fires only once ``after_step`` rows are logged, and a run that ends first (the
    event set) stops it without killing anything."""
    metrics, killed, done = tmp_path / "metrics.jsonl", [], threading.Event()
    metrics.write_text('{"step": 1}\n')
    killer = _kill_a_worker_later(metrics, Plan("external", after_step=3, delay_s=0.0), done, None, killed)
    killer.join(0.3)
    assert killer.is_alive()  # 1 of 3 steps logged: still waiting
    done.set()
    killer.join(2.0)
    assert not killer.is_alive() and killed == []
