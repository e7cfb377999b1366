"""Every GPU check of issue #29 in one run, each result saved as soon as its step ends.

The lent GPU machine comes rarely and for 15 minutes, starts included, so everything runs from one
command (``benchmarks/gpu_checks.sh``, which first installs the carried wheels) in under 9 minutes.
Each step is a subprocess with its own time limit (a hang or a CUDA crash costs that step only),
and the whole run keeps to ``--budget-s``: a step that would not fit is recorded as skipped.

Steps, in the issue's order:

1. ``gpu_tests`` (``pytest tests/gpu``, Megatron's files left to step 5), ``logprobs`` (HF engine
   against the actor, fp32 and bf16: ``benchmarks/gpu_steps.py``), ``make_model`` (a random-init
   model of the workload's architecture with the real tokenizer), ``main_job`` (one GRPO step of
   the main job on the GPU: ``--preset main_job`` on that model, its data, the answer check of
   ``benchmarks/gpu_reward.py``);
2. ``trl``: rlvr against TRL side by side (``benchmarks/bench_grpo_vs_trl.py``);
3. ``hybrid_memory``: offload settings (``benchmarks/bench_hybrid_memory.py``);
4. ``fp8_rollout`` (speed and mismatch, ``benchmarks/bench_fp8_rollout.py``) and ``fp8_train``
   (two main-job steps with ``rollout.quantization=fp8`` and token-level truncated IS);
5. ``megatron``: ``tests/gpu/*megatron*`` if there is such a test;
6. ``async`` (issue 25; only when named: ``--steps make_model,async --budget-s 420``, a call of
   its own): the main job synchronous, ``one_step`` and ``bounded`` on the one GPU, the rollout in a
   child process beside the actor (``benchmarks/bench_async.py``, 12 steps each).

Written under ``--out`` (at most 8 files come back from the GPU machine): ``results.jsonl`` (one
line per step: status, seconds, the step's JSON result; the first line describes the machine and
the versions), ``steps.log`` (each step's output, head and tail), ``summary.md`` (a table,
rewritten after every step). The bundle (``--bench``, made by ``prepare_gpu_bundle.sh``) holds
the tokenizer, the main job's data and the commit it was made from.

``--device cpu`` rehearses the whole run here on tiny models in a few minutes, with the imports the
GPU machine cannot do blocked (``benchmarks/gpu_sim.py``), so a broken step shows here first.

Usage::

    python -m benchmarks.gpu_checks --device cuda --out "$OUT"            # on the GPU machine
    python -m benchmarks.gpu_checks --device cpu --out runs/gpu_rehearsal  # the rehearsal here
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import runpy
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LOG_HEAD, LOG_TAIL = 4_000, 60_000
"""Characters of each step's output kept in steps.log (its start and its end)."""
MIN_STEP_S = 20
"""A step is skipped when less than this is left of the budget."""
VERSIONED = ("torch", "transformers", "accelerate", "peft", "trl", "datasets", "tensordict", "omegaconf",
             "safetensors", "tokenizers", "pyarrow", "numpy", "triton", "torchao", "vllm", "megatron-core")


@dataclass
class Context:
    """What the steps' commands are built from."""

    device: str
    size: str
    out: Path
    work: Path
    bench: Path
    simulate: bool

    @property
    def gpu(self) -> bool:
        return self.device == "cuda"

    @property
    def model_dir(self) -> Path:
        return self.work / "model"


@dataclass(frozen=True)
class Step:
    """One check: its name, group (the issue's numbering), time limit on GPU / CPU, and what it runs:
    ``command(ctx, result_json)`` gives a module run as ``python -m`` with its arguments, or a string
    saying why there is nothing to run (the step is then recorded as skipped)."""

    name: str
    group: str
    timeout_s: tuple[int, int]
    command: Callable[[Context, Path], list[str] | str]
    by_default: bool = True
    """False: runs only when named in ``--steps`` (it does not fit the default call's budget)."""


def _job_overrides(ctx: Context) -> list[str]:
    """The main job on the bundle: the random-init model of ``make_model``, the bundled data, the
    answer check of ``gpu_reward.py``, this device (the rehearsal: fewer prompts per step)."""
    data = ctx.bench / "arith"
    overrides = [
        f"actor_rollout_ref.model.path={ctx.model_dir}", f"data.train_files={data / 'train.jsonl'}",
        f"data.val_files={data / 'test.jsonl'}",
        f"custom_reward_function.path={REPO / 'benchmarks' / 'gpu_reward.py'}",
        "custom_reward_function.name=compute_score", f"trainer.device={ctx.device}",
        "actor_rollout_ref.actor.optim.warmup_steps=0", "trainer.call_timeout_s=300",
    ]
    if not ctx.gpu:  # the tiny rehearsal: fewer held-out prompts and prompts per step
        overrides += ["data.train_batch_size=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                      "data.val_max_samples=4"]
    return overrides


def _main_job(ctx: Context, result: Path, steps: int, *extra: str) -> list[str]:
    overrides = [
        *_job_overrides(ctx), f"trainer.total_training_steps={steps}", "trainer.val_before_train=false",
        "trainer.test_freq=-1", "trainer.report=false", "trainer.export_hf=false", "trainer.progress_bar=false",
        "trainer.max_time_s=null", f"trainer.default_local_dir={ctx.work / result.stem}",
        f"trainer.experiment_name={result.stem}",
    ]
    return ["rlvr.trainer.main_ppo", "--preset", "main_job", *overrides, *extra]


def _async(ctx: Context, result: Path) -> list[str]:
    """Issue 25 on one GPU: the main job synchronous, ``one_step`` and ``bounded`` (the rollout in a
    child process on the same GPU), one after the other (``benchmarks/bench_async.py``)."""
    steps = 12 if ctx.gpu else 2
    validation = ["data.val_max_samples=64"] if ctx.gpu else []
    return ["benchmarks.bench_async", "--steps", str(steps), "--seeds", "1", "--test-freq", str(steps),
            "--tool-steps", "0", "--calibration-steps", "0", "--no-ablation", "--out", str(ctx.work / result.stem),
            "--json", str(result), "--override", *_job_overrides(ctx), *validation]


def _gpu_tests(ctx: Context, result: Path) -> list[str]:
    return ["pytest", "-q", "-p", "no:cacheprovider", "tests/gpu", "--ignore-glob=*megatron*",
            f"--junitxml={result.with_suffix('.xml')}", "-o", "addopts=", "-m", "gpu"]


def _logprobs(ctx: Context, result: Path) -> list[str]:
    small = [] if ctx.gpu else ["--prompts", "2", "--samples", "2", "--response-len", "6"]
    return ["benchmarks.gpu_steps", "logprobs", "--size", ctx.size, "--device", ctx.device, "--tokenizer",
            str(ctx.bench / "tokenizer"), "--json", str(result), *small]


def _trl(ctx: Context, result: Path) -> list[str]:
    small = [] if ctx.gpu else ["--prompts", "2", "--samples", "2", "--response-len", "6"]
    return ["benchmarks.bench_grpo_vs_trl", "--size", ctx.size, "--device", ctx.device, "--steps", "2",
            "--warmup", "1", "--tokenizer", str(ctx.bench / "tokenizer"), "--json", str(result), *small]


def _hybrid(ctx: Context, result: Path) -> list[str]:
    small = [] if ctx.gpu else ["--prompts", "2", "--samples", "2", "--response-len", "6"]
    return ["benchmarks.bench_hybrid_memory", "--size", ctx.size, "--device", ctx.device, "--settings",
            "none,optimizer,both", "--steps", "1", "--warmup", "1", "--tokenizer", str(ctx.bench / "tokenizer"),
            "--json", str(result), *small]


def _fp8(ctx: Context, result: Path) -> list[str]:
    small = ["--compile"] if ctx.gpu else ["--prompts", "2", "--samples", "2", "--response-len", "6",
                                           "--repeats", "1"]
    return ["benchmarks.bench_fp8_rollout", "--size", ctx.size, "--device", ctx.device, "--tokenizer",
            str(ctx.bench / "tokenizer"), "--json", str(result), *small]


def _fp8_train(ctx: Context, result: Path) -> list[str]:
    return _main_job(ctx, result, 2, "actor_rollout_ref.rollout.quantization=fp8",
                     "algorithm.rollout_correction.rollout_is=token")


def _megatron(ctx: Context, result: Path) -> list[str] | str:
    tests = sorted(str(p.relative_to(REPO)) for p in (REPO / "tests" / "gpu").glob("*megatron*.py"))
    if not tests:
        return "no Megatron test in tests/gpu yet"
    return ["pytest", "-q", "-p", "no:cacheprovider", *tests, f"--junitxml={result.with_suffix('.xml')}",
            "-o", "addopts=", "-m", "gpu"]


def _make_model(ctx: Context, result: Path) -> list[str]:
    return ["benchmarks.gpu_steps", "make-model", "--size", ctx.size, "--tokenizer", str(ctx.bench / "tokenizer"),
            "--out", str(ctx.model_dir)]


STEPS = (
    Step("gpu_tests", "1 correctness", (150, 300), _gpu_tests),
    Step("logprobs", "1 correctness", (90, 300), _logprobs),
    Step("make_model", "1 correctness", (60, 120), _make_model),
    Step("main_job", "1 correctness", (150, 300), lambda ctx, result: _main_job(ctx, result, 1)),
    Step("trl", "2 against TRL", (240, 400), _trl),
    Step("hybrid_memory", "3 hybrid memory", (150, 300), _hybrid),
    Step("fp8_rollout", "4 fp8 rollout", (150, 300), _fp8),
    Step("fp8_train", "4 fp8 rollout", (120, 300), _fp8_train),
    Step("megatron", "5 megatron", (120, 300), _megatron),
    Step("async", "issue 25 async", (420, 400), _async, by_default=False),
)


def _versions() -> dict[str, str | None]:
    found = {}
    for name in VERSIONED:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def _run_quiet(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError) as err:
        return f"unavailable: {err}"


def environment(ctx: Context) -> dict:
    """The first line of results.jsonl: machine, versions, the commit the bundle was made from."""
    commit_file = ctx.bench / "COMMIT"
    return {"step": "environment", "device": ctx.device, "size": ctx.size, "simulated_gpu_imports": ctx.simulate,
            "python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
            "gpu": _run_quiet(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"])
            if ctx.gpu else None,
            "commit": (commit_file.read_text().strip() if commit_file.is_file()
                       else _run_quiet(["git", "rev-parse", "HEAD"])),
            "versions": _versions(), "time": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


def _append_jsonl(path: Path, record: dict) -> None:
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _append_log(path: Path, title: str, text: str) -> None:
    if len(text) > LOG_HEAD + LOG_TAIL:
        text = f"{text[:LOG_HEAD]}\n[... {len(text) - LOG_HEAD - LOG_TAIL} characters left out ...]\n{text[-LOG_TAIL:]}"
    with path.open("a") as f:
        f.write(f"\n===== {title}\n{text}\n")


def _junit_summary(path: Path) -> dict:
    """Counts and failed test names from a pytest junit XML file."""
    import xml.etree.ElementTree as ElementTree

    if not path.is_file():
        return {}
    root = ElementTree.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    counts = {key: sum(int(s.get(key, 0)) for s in suites) for key in ("tests", "failures", "errors", "skipped")}
    failed = [f"{case.get('classname')}::{case.get('name')}: {(bad.get('message') or '')[:300]}"
              for s in suites for case in s.iter("testcase") for bad in case if bad.tag in ("failure", "error")]
    return {**counts, "failed": failed}


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_step(step: Step, ctx: Context, timeout_s: float) -> dict:
    """Run one step in its own process group; its record for results.jsonl."""
    result = ctx.work / f"{step.name}.json"
    command = step.command(ctx, result)
    record = {"step": step.name, "group": step.group, "timeout_s": round(timeout_s)}
    if isinstance(command, str):
        return {**record, "status": "skipped", "reason": command}
    argv = [sys.executable, "-m", "benchmarks.gpu_checks", "--exec", *command]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RLVR_GPU_SIM": "1" if ctx.simulate else "0",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    start = time.perf_counter()
    with tempfile.TemporaryFile(mode="w+") as log:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout_s)
            status = "ok" if rc == 0 else "failed"
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            rc, status = proc.wait(), "timeout"
        _kill_group(proc)  # whatever the step left running (compile workers)
        log.seek(0)
        output = log.read()
    seconds = time.perf_counter() - start
    record.update(status=status, rc=rc, seconds=round(seconds, 1), command=" ".join(command))
    if result.is_file():
        record["result"] = json.loads(result.read_text())
    if result.with_suffix(".xml").is_file():
        record["result"] = _junit_summary(result.with_suffix(".xml"))
    if step.name in ("main_job", "fp8_train"):
        record["result"] = _trainer_metrics(ctx.work / result.stem / "metrics.jsonl")
    if status != "ok":
        record["output_tail"] = output[-3000:]
    _append_log(ctx.out / "steps.log", f"{step.name} ({status}, rc {rc}, {seconds:.1f} s): {' '.join(command)}", output)
    return record


TRAINER_KEYS = ("timing_s/step", "timing_s/gen", "timing_s/old_log_prob", "timing_s/update_actor", "timing_s/update_weights",
                "actor/reused_rollout_log_probs", "training/rollout_log_probs_diff_max",
                "training/rollout_log_probs_diff_mean", "training/rollout_probs_diff_max", "rollout_corr/kl",
                "rollout_corr/k3_kl", "rollout_corr/rollout_is_mean", "rollout_corr/rollout_is_ratio_fraction_high",
                "rollout_corr/rollout_is_eff_sample_size", "critic/score/mean", "actor/pg_loss", "actor/grad_norm",
                "train/skipped_step")


def _trainer_metrics(path: Path) -> dict:
    """The training steps' key metrics and the last validation's from a run's metrics.jsonl."""
    if not path.is_file():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    steps = [{k: row[k] for k in ("step", *TRAINER_KEYS) if k in row} for row in rows if "timing_s/step" in row]
    val = [{k: v for k, v in row.items() if k.startswith("val")} for row in rows if "timing_s/step" not in row]
    perf = {k: v for row in rows for k, v in row.items() if k.startswith("perf/")}
    return {"steps": steps, "validation": val[-1] if val else {}, "perf": perf}


def _summary_line(record: dict) -> str:
    result = record.get("result") or {}
    note = record.get("reason", "")
    if record["step"] == "trl" and "ratio_rlvr_over_trl" in result:
        note = (f"rlvr {result['rlvr']['median_s']:.2f} s, TRL {result['trl']['median_s']:.2f} s, "
                f"ratio {result['ratio_rlvr_over_trl']:.3f}")
    elif record["step"] == "fp8_rollout" and "fp8_speedup" in result:
        note = (f"fp8 speed-up {result['fp8_speedup']:.2f}x, |dlogp| vs actor max "
                f"{result['log_prob_gap']['fp8_vs_actor_same_dtype']['max']:.3g}")
    elif record["step"] == "hybrid_memory" and "settings" in result:
        note = "; ".join(f"{name}: gen {s['stage_peak_gib'].get('gen', float('nan')):.2f} GiB, update "
                         f"{s['stage_peak_gib'].get('update_actor', float('nan')):.2f} GiB, "
                         f"{s.get('offload_cost_s_per_step', 0.0):+.2f} s/step"
                         for name, s in result["settings"].items())
    elif record["step"] in ("main_job", "fp8_train") and result.get("steps"):
        last = result["steps"][-1]
        note = ", ".join(f"{k.split('/')[-1]} {last[k]:.3g}" for k in
                         ("timing_s/step", "training/rollout_log_probs_diff_max", "rollout_corr/rollout_is_mean")
                         if k in last)
    elif record["step"] == "async" and "main_job" in result:
        note = "; ".join(f"{mode} {row['steps_per_hour']:.0f} steps/h ({row['speedup']:.2f}x)"
                         for mode, row in result["main_job"]["table"].items())
    elif "tests" in result:
        note = f"{result['tests']} tests, {result['failures'] + result['errors']} failed, {result['skipped']} skipped"
    elif record["step"] == "logprobs" and "float32" in result:
        note = f"fp32 max {result['float32']['max']:.3g}, bf16 max {result['bfloat16']['max']:.3g}"
    return f"| {record['step']} | {record['status']} | {record.get('seconds', '-')} | {note} |"


def write_summary(ctx: Context, records: list[dict], env: dict) -> None:
    lines = [f"# GPU checks ({env['device']}, {env.get('gpu') or env['platform']}, commit {env['commit']})", "",
             "| step | status | seconds | result |", "|---|---|---|---|", *map(_summary_line, records)]
    tmp = ctx.out / "summary.md.tmp"
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(ctx.out / "summary.md")


def run_all(ctx: Context, budget_s: float, only: set[str] | None, min_step_s: float = MIN_STEP_S) -> list[dict]:
    """Run the steps in order (``only``: these), each within what is left of ``budget_s``; a step
    with less than ``min_step_s`` left is skipped. Returns the records (also in results.jsonl)."""
    ctx.out.mkdir(parents=True, exist_ok=True)
    ctx.work.mkdir(parents=True, exist_ok=True)
    env = environment(ctx)
    _append_jsonl(ctx.out / "results.jsonl", env)
    print(json.dumps(env), flush=True)
    started, records = time.perf_counter(), []
    for step in STEPS:
        selected = step.name in only if only is not None else step.by_default
        if not selected:
            continue
        left = budget_s - (time.perf_counter() - started)
        timeout = min(step.timeout_s[0 if ctx.gpu else 1], left)
        if timeout < min_step_s:
            record = {"step": step.name, "group": step.group, "status": "skipped",
                      "reason": f"budget: {max(left, 0.0):.0f} s of {budget_s:.0f} s left"}
        else:
            record = run_step(step, ctx, timeout)
        records.append(record)
        _append_jsonl(ctx.out / "results.jsonl", record)
        write_summary(ctx, records, env)
        print(_summary_line(record), flush=True)
    print(f"total {time.perf_counter() - started:.0f} s", flush=True)
    return records


def exec_module(argv: list[str]) -> None:
    """Run ``python -m argv[0] argv[1:]`` in this process, the GPU machine's imports first
    (``RLVR_GPU_SIM=1``: rehearsal)."""
    if os.environ.get("RLVR_GPU_SIM") == "1":
        from benchmarks.gpu_sim import install

        install()
    sys.argv = list(argv)
    runpy.run_module(argv[0], run_name="__main__", alter_sys=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cuda: the real run; cpu: rehearsal")
    parser.add_argument("--size", help="workload (default: smollm2-135m on cuda, tiny on cpu)")
    parser.add_argument("--out", required=True, help="folder of results.jsonl, steps.log, summary.md")
    parser.add_argument("--work", help="scratch folder (model, run dirs; default: a temporary folder)")
    parser.add_argument("--bench", default=str(REPO / ".bench"), help="the carried bundle: tokenizer/, arith/, COMMIT")
    parser.add_argument("--budget-s", type=float,
                        help="wall-clock budget of all steps (default 500 on cuda, 1500 on cpu)")
    parser.add_argument("--steps", help="comma list: run only these steps")
    parser.add_argument("--simulate-gpu-imports", choices=("auto", "on", "off"), default="auto",
                        help="block the imports the GPU machine lacks (auto: on with --device cpu)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--exec"]:
        exec_module(argv[1:])
        return 0
    args = parse_args(argv)
    gpu = args.device == "cuda"
    simulate = args.simulate_gpu_imports == "on" or (args.simulate_gpu_imports == "auto" and not gpu)
    names = {name.strip() for name in args.steps.split(",")} if args.steps else None
    unknown = (names or set()) - {step.name for step in STEPS}
    if unknown:
        raise SystemExit(f"unknown steps {sorted(unknown)}; the steps are {', '.join(s.name for s in STEPS)}")
    bench = Path(args.bench)
    missing = [str(p) for p in (bench / "tokenizer", bench / "arith" / "train.jsonl") if not p.exists()]
    if missing:
        raise SystemExit(f"the bundle is incomplete ({', '.join(missing)} missing): run "
                         "benchmarks/prepare_gpu_bundle.sh here and carry .whl and .bench")
    with tempfile.TemporaryDirectory(prefix="rlvr_gpu_checks_") as scratch:
        ctx = Context(device=args.device, size=args.size or ("smollm2-135m" if gpu else "tiny"), out=Path(args.out),
                      work=Path(args.work or scratch), bench=bench, simulate=simulate)
        records = run_all(ctx, args.budget_s or (500.0 if gpu else 1500.0), names)
    return 0 if all(r["status"] in ("ok", "skipped") for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
