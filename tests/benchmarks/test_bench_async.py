"""The sync/async benchmark's bookkeeping: steps per hour, accuracy by step and at equal training
time, the comparison over seeds."""

from __future__ import annotations

import json

import pytest

from benchmarks.bench_async import accuracy_at, compare, summarize


def run(step_s: float, accuracies: dict[int, float], gen_s: float | None = None, extra: dict | None = None) -> dict:
    """A run of 4 steps of ``step_s`` seconds (``gen_s`` of them generating, else half) with
    validations at the given steps; ``extra`` metrics in every step's row."""
    rows = []
    for step in range(5):
        if step > 0:
            rows.append({"step": step, "timing_s/step": step_s, "timing_s/gen": step_s / 2 if gen_s is None else gen_s,
                         **(extra or {})})
        if step in accuracies:
            rows.append({"step": step, "val/acc": accuracies[step]})
    return {"rows": rows, "wall_s": 5 * step_s, "load_before": (1.0, 1.0, 1.0), "load_after": (2.0, 1.0, 1.0)}


def test_steps_per_hour_leave_validation_out_and_accuracy_is_interpolated_on_training_time():
    summary = summarize(run(10.0, {0: 0.2, 2: 0.6, 4: 0.8}))
    assert summary["steps"] == 4 and summary["steps_per_hour"] == pytest.approx(360.0)
    assert summary["accuracy_clock"] == {0: 0.0, 2: 20.0, 4: 40.0}
    assert accuracy_at(summary, 10.0) == pytest.approx(0.4) and accuracy_at(summary, 30.0) == pytest.approx(0.7)
    assert accuracy_at(summary, 99.0) == pytest.approx(0.8)
    assert summary["medians"]["timing_s/gen"] == 5.0


def test_compare_gives_speedups_accuracy_deltas_and_sync_at_equal_time():
    summaries = {"sync": [summarize(run(10.0, {0: 0.2, 4: 0.8})), summarize(run(10.0, {0: 0.2, 4: 0.6}))],
                 "one_step": [summarize(run(8.0, {0: 0.2, 4: 0.7})), summarize(run(8.0, {0: 0.2, 4: 0.7}))]}
    table = compare(summaries)
    assert table["one_step"]["speedup"] == pytest.approx(10.0 / 8.0)
    assert table["one_step"]["accuracy_delta_at_last_step"] == pytest.approx(0.7 - 0.7)
    # async finished at 32 s: sync was at 0.2 + (0.8 - 0.2) * 32 / 40 and 0.2 + (0.6 - 0.2) * 32 / 40
    assert table["one_step"]["sync_accuracy_at_equal_time"] == pytest.approx((0.68 + 0.52) / 2)


def test_a_finished_run_is_read_back_and_an_unfinished_one_is_not(tmp_path):
    from benchmarks.bench_async import finished_run

    run_dir = tmp_path / "main_job_sync_seed1"
    run_dir.mkdir()
    assert finished_run(run_dir, 4) is None  # no run.json: the command never finished
    record = run(10.0, {0: 0.2, 4: 0.8})
    (run_dir / "run.json").write_text(json.dumps(record))
    assert finished_run(run_dir, 4) == json.loads(json.dumps(record))  # the load averages come back as lists
    assert finished_run(run_dir, 5) is None  # asked for more steps than it ran


def test_report_only_tabulates_the_seeds_that_finished_every_schedule(tmp_path, monkeypatch, capsys):
    from benchmarks import bench_async

    step_s = {"sync": 10.0, "one_step": 8.0, "bounded": 5.0}
    for seed, modes in ((1, step_s), (2, {"sync": 10.0})):  # seed 2 stopped after its sync run
        for mode in modes:
            run_dir = tmp_path / f"main_job_{mode}_seed{seed}"
            run_dir.mkdir()
            (run_dir / "run.json").write_text(json.dumps(run(step_s[mode], {0: 0.1, 4: 0.5})))
    monkeypatch.setattr(bench_async, "run_job", lambda *a, **k: pytest.fail("report-only ran a job"))
    monkeypatch.setattr("sys.argv", ["bench_async", "--report-only", "--out", str(tmp_path), "--steps", "4",
                                     "--seeds", "1", "2", "--tool-steps", "0", "--no-ablation"])
    bench_async.main()
    assert "main_job seed 2: left out, not every schedule finished (one_step, bounded missing)" in capsys.readouterr().out
    report = json.loads((tmp_path / "bench_async.json").read_text())
    table = report["main_job"]["table"]
    assert table["one_step"]["speedup"] == pytest.approx(1.25) and table["bounded"]["speedup"] == pytest.approx(2.0)
    assert len(report["main_job"]["runs"]["sync"]) == 1 and "simulator" not in report  # no calibration run
    assert "### main job (1 seed)" in (tmp_path / "bench_async.md").read_text()


def test_lend_tabulates_the_lent_schedules_beside_the_same_sync_runs(tmp_path, monkeypatch):
    from benchmarks import bench_async

    step_s = {"sync": 10.0, "one_step": 8.0, "bounded": 5.0, "one_step_lend": 6.4, "bounded_lend": 4.0}
    for mode, seconds in step_s.items():
        run_dir = tmp_path / f"main_job_{mode}_seed1"
        run_dir.mkdir()
        (run_dir / "run.json").write_text(json.dumps(run(seconds, {0: 0.1, 4: 0.5})))
    monkeypatch.setattr(bench_async, "run_job", lambda *a, **k: pytest.fail("report-only ran a job"))
    monkeypatch.setattr("sys.argv", ["bench_async", "--report-only", "--out", str(tmp_path), "--steps", "4",
                                     "--seeds", "1", "--tool-steps", "0", "--no-ablation", "--lend"])
    bench_async.main()
    report = json.loads((tmp_path / "bench_async.json").read_text())
    assert list(report["main_job_lend"]["table"]) == ["sync", "one_step_lend", "bounded_lend"]
    assert "tool_job_lend" not in report and report["main_job"]["table"]["bounded"]["speedup"] == pytest.approx(2.0)
    assert report["main_job_lend"]["table"]["one_step_lend"]["speedup"] == pytest.approx(10.0 / 6.4)
    assert report["main_job_lend"]["table"]["bounded_lend"]["speedup"] == pytest.approx(10.0 / 4.0)
    assert "### main job, idle cores lent" in (tmp_path / "bench_async.md").read_text()
    assert all(overrides[-1] == "async_training.lend_idle_cores=true" for overrides in bench_async.LENDING.values())


def test_lend_only_runs_sync_and_the_lent_schedules_alone(tmp_path, monkeypatch, capsys):
    from benchmarks import bench_async

    ran = []

    def fake_run_job(preset, name, overrides, out, steps, seed, test_freq):
        ran.append(name)
        if name == bench_async.CALIBRATION:  # one thread: generation 6 s (1.2x), the rest 8 s (1.6x)
            assert overrides[0] == "trainer.num_threads=1"
            calibration = run(14.0, {}, gen_s=6.0)
            calibration["rows"][0].update({"timing_s/gen": 20.0, "timing_s/step": 28.0})  # warming up: left out
            return calibration
        mode = name.split("_", 2)[2].rsplit("_", 1)[0]
        extra = {"async/weight_push_s": 0.5} if "lend" in name else {}
        if mode == "one_step_lend":  # its generations: 7.2 s beside the trainer (1.2x the calibration's 6 s)
            extra.update({"async/rollout_gen_s": 7.2, "async/rollout_lent_core_share": 0.0})
        return run({"sync": 10.0, "one_step_lend": 8.0, "bounded_lend": 7.0}[mode], {0: 0.1, 4: 0.5}, extra=extra)

    monkeypatch.setattr(bench_async, "run_job", fake_run_job)
    monkeypatch.setattr("sys.argv", ["bench_async", "--lend-only", "--out", str(tmp_path), "--steps", "4",
                                     "--seeds", "1", "2", "--tool-steps", "0", "--calibration-steps", "4"])
    bench_async.main()
    assert ran == [bench_async.CALIBRATION,
                   *(f"main_job_{mode}_seed{seed}" for seed in (1, 2) for mode in ("sync", "one_step_lend", "bounded_lend"))]
    report = json.loads((tmp_path / "bench_async.json").read_text())
    assert "main_job" not in report and "ablation" not in report and "simulator" not in report
    assert report["main_job_lend"]["table"]["bounded_lend"]["speedup"] == pytest.approx(10.0 / 7.0)
    # every step: generation 5 s and the rest 5 s on two threads; one thread 6 s and 8 s + the 0.5 s push;
    # beside the trainer 1.2x slower again (steps 2-4 of both seeds: the calibration's first is left out)
    check = report["lending_simulator"]
    assert (check["gen_factor"], check["rest_factor"], check["push_s"]) == pytest.approx((1.2, 1.6, 0.5))
    assert check["corun"] == pytest.approx(1.2) and check["corun_generations"] == 6
    assert check["ceiling"] == pytest.approx((1 / 1.2 + 1 / 1.6) / 1.2)
    # batches 1-3 generate (7.2 s) beside updates 0-2 (8.5 x 1.2 s), which finish on both cores (5.5 s
    # whole; unlent on one core, 8.5 s whole); update 3 alone
    lent = 4 * 10.0 / (3 * (7.2 + (1.0 - 7.2 / 10.2) * 5.5) + 5.5)
    unlent = 4 * 10.0 / (3 * (7.2 + (1.0 - 7.2 / 10.2) * 8.5) + 8.5)
    lent_no_corun = 4 * 10.0 / (3 * (6.0 + (1.0 - 6.0 / 8.5) * 5.5) + 5.5)
    for seed in check["seeds"]:
        assert seed["predicted"]["one_step_lend/speedup"] == pytest.approx(lent)
        assert seed["predicted"]["one_step/speedup"] == pytest.approx(unlent)
        assert seed["predicted"]["bounded_lend/speedup"] == pytest.approx(lent)  # the trainer is the long side
        assert seed["predicted_no_corun"]["one_step_lend/speedup"] == pytest.approx(lent_no_corun)
        assert seed["measured"] == pytest.approx(10.0 / 8.0)
    assert (f"predicted one_step_lend {lent:.2f}, {lent:.2f} (one_step unlent {unlent:.2f}, {unlent:.2f}; bounded_lend "
            f"{lent:.2f}, {lent:.2f}; one_step_lend without the co-running slowdown {lent_no_corun:.2f}, "
            f"{lent_no_corun:.2f}); measured one_step_lend 1.25, 1.25. Ceiling of overlap on these cores (balanced "
            "sides, no waits, no push): 1.22x.") in (tmp_path / "bench_async.md").read_text()
    ran.clear()
    monkeypatch.setattr("sys.argv", ["bench_async", "--lend-only", "--out", str(tmp_path / "nocal"), "--steps", "4",
                                     "--seeds", "1", "--tool-steps", "0", "--calibration-steps", "0"])
    bench_async.main()
    assert bench_async.CALIBRATION not in ran
    assert "lending_simulator" not in json.loads((tmp_path / "nocal" / "bench_async.json").read_text())
    ran.clear()
    monkeypatch.setattr("sys.argv", ["bench_async", "--lend-only", "--out", str(tmp_path / "one"), "--calibration-steps", "1"])
    with pytest.raises(SystemExit):
        bench_async.main()
    assert "--calibration-steps 1 leaves the lending check no step" in capsys.readouterr().err and not ran
    empty = tmp_path / "empty"
    monkeypatch.setattr("sys.argv", ["bench_async", "--lend-only", "--report-only", "--out", str(empty), "--steps", "4"])
    with pytest.raises(SystemExit, match="no seed of the main job finished in sync and every lent schedule"):
        bench_async.main()


def test_the_simulator_check_compares_the_same_first_steps_of_sync_and_the_calibration():
    from benchmarks.bench_async import simulator_check

    def timed(pairs, extra=None):  # (gen, step) seconds per step
        rows = [{"step": i + 1, "timing_s/gen": g, "timing_s/step": s, "async/weight_push_s": 0.5, **(extra or {})}
                for i, (g, s) in enumerate(pairs)]
        return summarize({"rows": rows, "wall_s": 0.0, "load_before": (0, 0, 0), "load_after": (0, 0, 0)})

    sync = timed([(8.0, 20.0)] * 2 + [(4.0, 8.0)] * 6)  # the first steps are the slow ones
    calibration = timed([(10.0, 26.0)] * 2)
    recomputed = timed([(0.0, 9.0)] * 8, {"timing_s/old_log_prob": 2.0})  # runs with a separate proximal pass
    check = simulator_check({"sync": [sync], "one_step": [recomputed]}, calibration, {"one_step": 0.9})
    assert check["steps"] == 2 and check["two_threads"] == {"gen_s": 8.0, "train_s": 12.0}
    assert check["one_thread"] == {"gen_s": 10.0, "train_s": 16.0} and check["push_s"] == 0.5
    # sync 20 s; the trainer's side 16 * 4/3 + 0.5 against 10 s of generation
    assert check["proximal_pass"] is True
    assert check["predicted"]["one_step/speedup"] == pytest.approx(20.0 / (16.0 * 4 / 3 + 0.5))
    # the proximal log-probs from the update: no extra pass on the trainer's side
    check = simulator_check({"sync": [sync], "one_step": [timed([(0.0, 9.0)] * 8)]}, calibration, {"one_step": 0.9})
    assert check["proximal_pass"] is False
    assert check["predicted"]["one_step/speedup"] == pytest.approx(20.0 / (16.0 + 0.5))


def test_corun_pairs_take_only_generations_that_ran_beside_a_computing_trainer():
    from benchmarks.bench_async import corun_pairs

    calibration = {"gen_and_step_s": [[20.0, 30.0], [6.0, 14.0], [5.0, 12.0], [7.0, 15.0]]}
    run_a = {"rollout_gen_s": [[7.0, 1.0], [7.5, 0.0], [5.5, 0.4], [8.0, 0.0], [9.0, 0.0]]}  # step 3 partly lent
    run_b = {"rollout_gen_s": [[7.0, 1.0], [None, None], [6.0, 0.0]]}  # step 2 had no generation of its own
    # the first step (warming up) and the steps past the calibration's are left out
    assert corun_pairs([run_a, run_b], calibration) == ([6.0, 7.0, 5.0], [7.5, 8.0, 6.0])


def test_the_ablation_runs_on_the_first_seeds_beside_their_own_sync_runs(tmp_path, monkeypatch, capsys):
    from benchmarks import bench_async

    step_s = {"sync": 10.0, "one_step": 8.0, "bounded": 5.0, "bounded_s4_corrected": 4.0, "bounded_s4_uncorrected": 5.0}
    accuracy = {1: 0.5, 2: 0.7, 3: 0.9}
    for seed in (1, 2, 3):
        for mode, seconds in step_s.items():
            if seed == 3 and mode.startswith("bounded_s4"):
                continue  # the ablation runs on the first two seeds only
            run_dir = tmp_path / f"main_job_{mode}_seed{seed}"
            run_dir.mkdir()
            acc = accuracy[seed] - (0.2 if mode == "bounded_s4_corrected" else 0.0)
            (run_dir / "run.json").write_text(json.dumps(run(seconds * seed, {0: 0.1, 4: acc})))
    monkeypatch.setattr(bench_async, "run_job", lambda *a, **k: pytest.fail("report-only ran a job"))
    monkeypatch.setattr("sys.argv", ["bench_async", "--report-only", "--out", str(tmp_path), "--steps", "4",
                                     "--seeds", "1", "2", "3", "--tool-steps", "0", "--calibration-steps", "0",
                                     "--ablation-seeds", "2"])
    bench_async.main()
    ablation = json.loads((tmp_path / "bench_async.json").read_text())["ablation"]
    assert [s["seed"] for s in ablation["runs"]["sync"]] == [1, 2]  # seed 3's sync is not in the comparison
    table = ablation["table"]
    assert table["bounded_s4_corrected"]["speedup"] == pytest.approx(2.5)
    assert table["bounded_s4_corrected"]["accuracy_delta_at_last_step"] == pytest.approx(-0.2)
    assert table["bounded_s4_uncorrected"]["accuracy_delta_at_last_step"] == pytest.approx(0.0)
    assert "### staleness 4, with and without the decoupled-PPO correction (2 seeds)" in (
        tmp_path / "bench_async.md").read_text()
    # a seed whose ablation finished but whose synchronous run did not: said, and the table left out
    for mode in ("bounded_s4_corrected", "bounded_s4_uncorrected"):
        (tmp_path / f"main_job_{mode}_seed3").mkdir()
        (tmp_path / f"main_job_{mode}_seed3" / "run.json").write_text(json.dumps(run(4.0, {0: 0.1, 4: 0.5})))
    (tmp_path / "main_job_one_step_seed3" / "run.json").unlink()
    monkeypatch.setattr("sys.argv", ["bench_async", "--report-only", "--out", str(tmp_path), "--steps", "4",
                                     "--seeds", "1", "2", "3", "--tool-steps", "0", "--calibration-steps", "0",
                                     "--ablation-seeds", "3"])
    bench_async.main()
    assert "ablation: left out, seeds [3] have no synchronous run to compare with" in capsys.readouterr().out
    assert "ablation" not in json.loads((tmp_path / "bench_async.json").read_text())
