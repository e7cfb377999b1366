"""The GPU checks in one run, each result saved as soon as its step ends.

The lent GPU machine comes rarely and for 15 minutes, starts included, so everything runs from one
command (``benchmarks/gpu_checks.sh``, which first installs the carried wheels) in under 9 minutes.
Each step is a subprocess with its own time limit (a hang or a CUDA crash costs that step only),
and the whole run keeps to ``--budget-s``: a step that would not fit is recorded as skipped. The
steps, their order (issue #47's checks, the most valuable first) and what each runs are in
``benchmarks/gpu_check_steps.py``.

Written under ``--out`` (at most 8 files come back from the GPU machine): ``results.jsonl`` (one
line per step: status, seconds, the step's JSON result; the first line describes the machine and
the versions), ``steps.log`` (each step's output, head and tail), ``summary.md`` (a table,
rewritten after every step). The bundle (``--bench``, made by ``prepare_gpu_bundle.sh``) holds
the tokenizer, the main job's data and the commit it was made from.

``--device cpu`` rehearses the whole run here on tiny models in a few minutes, with the imports the
GPU machine cannot do blocked (``benchmarks/gpu_sim.py``), so a broken step shows here first; the
GPU tests of ``tests/gpu`` that can run on CPU run there on CPU (``RLVR_GPU_TESTS_DEVICE=cpu``).

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
from importlib import metadata
from pathlib import Path

from benchmarks.gpu_check_steps import STEPS, TRAINER_KEYS, Context, Step, summary_note

__all__ = ["STEPS", "Context", "Step", "main", "run_all"]

REPO = Path(__file__).resolve().parent.parent
LOG_HEAD, LOG_TAIL = 4_000, 60_000
"""Characters of each step's output kept in steps.log (its start and its end)."""
MIN_STEP_S = 20
"""A step is skipped when less than this is left of the budget."""
VERSIONED = ("torch", "transformers", "accelerate", "peft", "trl", "datasets", "tensordict", "omegaconf",
             "safetensors", "tokenizers", "pyarrow", "numpy", "triton", "torchao", "vllm", "megatron-core")


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
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])), **dict(step.env)}
    if not ctx.gpu:  # the rehearsal: the GPU tests that can run on CPU do (tests/gpu/conftest.py)
        env["RLVR_GPU_TESTS_DEVICE"] = "cpu"
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
    return f"| {record['step']} | {record['status']} | {record.get('seconds', '-')} | {summary_note(record)} |"


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
        selected = step.name in only if only is not None else (step.by_default if ctx.gpu else step.rehearsed)
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
