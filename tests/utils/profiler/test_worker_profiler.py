"""A worker process's profiler on CPU: which roles and ranks it records, one Chrome trace per role
and step (or per stage call), traces that parse, torch's memory timeline for torch_memory, the
finish hook and the summary's top operators."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlvr.trainer.config import load_config
from rlvr.utils.profiler.summary import format_summary, merge_reports
from rlvr.utils.profiler.worker import WorkerProfiler


def _config(tmp_path: Path, *overrides: str):
    return load_config(None, ["global_profiler.tool=torch", "global_profiler.steps=[1,2]",
                              f"global_profiler.save_path={tmp_path}", "actor_rollout_ref.actor.profiler.enable=true",
                              *overrides])


def _work(n: int = 64) -> None:
    x = torch.randn(n, n)
    for _ in range(3):
        x = torch.tanh(x @ x / n)


def _load(path: Path) -> dict:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def _ranges(trace: dict) -> list[str]:
    """The rlvr stage ranges (``<role>/<stage>``) of a trace, in time order."""
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X" and "/" in e["name"] and "::" not in e["name"]
              and e["name"].split("/")[0] in ("actor", "rollout", "ref", "critic")]
    return [e["name"] for e in sorted(events, key=lambda e: float(e["ts"]))]


def test_one_trace_per_role_and_step_holding_its_stages_only(tmp_path):
    profiler = WorkerProfiler(_config(tmp_path), ("actor", "rollout", "ref"), rank=0, device="cpu")
    assert sorted(profiler.roles) == ["actor", "rollout"]  # ref not enabled; rollout follows the actor's enable
    for step in (1, 2):
        profiler.start(step)
        for stage in ("gen", "old_log_prob", "ref", "update_actor"):
            with profiler.stage(stage):
                _work()
        report = profiler.stop(flush=True)
        assert report["actor"]["calls"] == {"old_log_prob": 1, "update_actor": 1}
        assert report["actor"]["ops"]["aten::mm"][0] == 6  # 2 stages x 3 matmuls
    with profiler.stage("update_actor"):  # outside a profiled step: nothing is recorded
        _work()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [f"{role}_step{s}_rank0.pt.trace.json.gz" for role in ("actor", "rollout") for s in (1, 2)]
    actor = _load(tmp_path / "actor_step1_rank0.pt.trace.json.gz")
    assert _ranges(actor) == ["actor/old_log_prob", "actor/update_actor"]  # the two sessions merged, in order
    assert _ranges(_load(tmp_path / "rollout_step2_rank0.pt.trace.json.gz")) == ["rollout/gen"]
    for event in actor["traceEvents"]:
        assert "ph" in event and ("ts" in event or event["ph"] == "M")


def test_rank_selection(tmp_path):
    cfg = _config(tmp_path, "actor_rollout_ref.actor.profiler.ranks=[1]", "critic.profiler.enable=true",
                  "critic.profiler.all_ranks=true")
    assert list(WorkerProfiler(cfg, ("actor",), rank=0, device="cpu").roles) == []
    assert list(WorkerProfiler(cfg, ("actor",), rank=1, device="cpu").roles) == ["actor"]
    assert list(WorkerProfiler(cfg, ("critic",), rank=3, device="cpu").roles) == ["critic"]
    assert list(WorkerProfiler(_config(tmp_path), ("actor",), rank=1, device="cpu").roles) == []  # default: rank 0


def test_discrete_and_continuous_steps(tmp_path):
    discrete = WorkerProfiler(_config(tmp_path / "d", "actor_rollout_ref.actor.profiler.tool_config.torch.discrete=true"),
                              ("actor",), rank=0, device="cpu")
    discrete.start(1)
    for stage in ("update_actor", "update_actor"):
        with discrete.stage(stage):
            _work()
    discrete.stop()
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == [
        "actor_step1_update_actor1_rank0.pt.trace.json.gz", "actor_step1_update_actor2_rank0.pt.trace.json.gz"]
    joined = WorkerProfiler(_config(tmp_path / "c"), ("actor",), rank=0, device="cpu")
    for step, flush in ((1, False), (2, True)):
        joined.start(step)
        with joined.stage("update_actor"):
            _work()
        joined.stop(flush=flush)
    trace = _load(tmp_path / "c" / "actor_steps1-2_rank0.pt.trace.json.gz")
    assert _ranges(trace) == ["actor/update_actor", "actor/update_actor"]


IMPORT_FRAMES = """
import json, os, sys, tempfile
import torch
if sys.argv[1] == "rlvr":
    import rlvr.utils.profiler.torch_profile
from torch.profiler import profile, record_function
with profile(with_stack=True) as session:
    with record_function("actor/update_actor"):
        torch.ones(4) + 1
path = os.path.join(tempfile.mkdtemp(), "trace.json")
session.export_chrome_trace(path)
text = open(path, encoding="utf-8", errors="replace").read()
print(text.count("_cupti_monitor.py(0)"))
"""


@pytest.mark.parametrize(("imports", "module_frames"), [pytest.param("torch", True, marks=pytest.mark.slow),
                                                      ("rlvr", False)])
def test_the_lazy_profiler_import_is_not_traced(imports, module_frames):
    """torch 2.13 imports torch.profiler._cupti_monitor at the first record_function of a process; in
    a with_stack session its import frames are recorded as ``_cupti_monitor.py(0): <name>`` with a name
    read from memory that is sometimes undecodable or an unescaped quote (the session then fails to
    parse, or its Chrome trace is not JSON). rlvr imports the module first, so no import is traced.
    The plain-torch case checks that the bug is still there (drop the workaround when it is not)."""
    done = subprocess.run([sys.executable, "-c", IMPORT_FRAMES, imports], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])})
    assert done.returncode == 0, done.stderr[-2000:]
    frames = int(done.stdout.split()[-1])
    if module_frames and frames == 0:  # whether torch traces its import varies by machine and install
        pytest.skip("plain torch traced no import frames of _cupti_monitor here (a fresh-clone run did not); "
                    "the rlvr case still checks that rlvr's import leaves none")
    assert (frames > 0) == module_frames


def test_a_traced_python_stack_parses(tmp_path):
    cfg = _config(tmp_path, "actor_rollout_ref.actor.profiler.tool_config.torch.contents=[cpu,memory,shapes,stack]")
    profiler = WorkerProfiler(cfg, ("actor",), rank=0, device="cpu")
    for step in (1, 2):
        profiler.start(step)
        with profiler.stage("update_actor"):
            _work()
        report = profiler.stop()
    trace = _load(tmp_path / "actor_step2_rank0.pt.trace.json.gz")
    assert any(e.get("cat") == "python_function" for e in trace["traceEvents"])
    assert report["actor"]["ops"]["aten::mm"][4] > 0  # memory: the matmuls allocated their outputs


def test_torch_memory_on_cpu_writes_memory_timelines(tmp_path):
    cfg = _config(tmp_path, "global_profiler.tool=torch_memory")
    profiler = WorkerProfiler(cfg, ("actor",), rank=0, device="cpu")
    profiler.start(1)
    with profiler.stage("update_actor"):
        _work(128)
    report = profiler.stop()
    path = tmp_path / "torch_memory" / "step1" / "actor_update_actor1_rank0.memory_timeline.json"
    assert report["actor"]["files"] == [str(path)]
    times, sizes = json.loads(path.read_text())
    assert len(times) == len(sizes) > 0 and max(map(sum, sizes)) >= 128 * 128 * 4  # a [128, 128] fp32 output
    assert report["actor"]["ops"]["aten::mm"][4] == 3 * 128 * 128 * 4


def test_finish_hook_runs_once_on_the_hook_ranks(tmp_path):
    out = tmp_path / "hook.txt"
    cmd = f'echo "$VERL_PROFILE_ROLE $VERL_PROFILE_RANK $VERL_PROFILE_TOOL $VERL_PROFILE_SAVE_PATH" >> {out}'
    cfg = _config(tmp_path, f"global_profiler.finish_hook_cmd='{cmd}'", "global_profiler.finish_hook_ranks=[0]")
    for rank in (0, 1):
        profiler = WorkerProfiler(cfg, ("actor", "rollout"), rank=rank, device="cpu")
        profiler.start(1)
        profiler.stop(run_hook=False)
        profiler.start(2)
        report = profiler.stop(run_hook=True)
    assert out.read_text() == f"actor 0 torch {tmp_path}\n"  # one command, once per process, rank 0 only
    failing = _config(tmp_path, "global_profiler.finish_hook_cmd='exit 3'")
    profiler = WorkerProfiler(failing, ("actor",), rank=0, device="cpu")
    profiler.start(1)
    report = profiler.stop(run_hook=True)
    assert report["actor"]["hooks"][0]["exit_code"] == 3


def test_summary_lists_the_top_operators_per_role():
    reports = [{"actor": {"tool": "torch", "calls": {"update_actor": 1}, "peak_bytes": {}, "files": ["a"], "hooks": [],
                          "ops": {"aten::mm": [3, 900.0, 900.0, 0, 0], "actor/update_actor": [1, 50.0, 1000.0, 0, 0],
                                  "threading.py(331): wait": [1, 5000.0, 5000.0, 0, 0], "aten::add": [2, 100.0, 100, 0, 0]}}},
               {"actor": {"tool": "torch", "calls": {"update_actor": 1}, "peak_bytes": {}, "files": ["b"], "hooks": [],
                          "ops": {"aten::mm": [3, 1100.0, 1100.0, 0, 0]}}}]
    merged = merge_reports(reports)
    assert merged["actor"]["ops"]["aten::mm"] == [6, 2000.0, 2000.0, 0, 0] and merged["actor"]["files"] == ["a", "b"]
    text = format_summary(merged, "torch", [1, 2], Path("/out"))
    lines = text.splitlines()
    assert lines[0] == "profiler (torch) over steps [1, 2]: files under /out"
    assert lines[1] == "actor (torch): update_actor x2; 2 file(s)"
    assert lines[3].split() == ["2.00", "95.2%", "6", "aten::mm"] and lines[4].split()[-1] == "aten::add"
    assert "wait" not in text and "actor/update_actor" not in text  # Python frames and stage ranges left out


@pytest.mark.gpu
def test_cuda_traces_and_memory_snapshot(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    profiler = WorkerProfiler(_config(tmp_path, "critic.profiler.enable=true", "critic.profiler.tool=torch_memory"),
                              ("actor", "critic"), rank=0, device="cuda:0")
    profiler.start(1)
    for stage in ("update_actor", "update_critic"):
        with profiler.stage(stage):
            x = torch.randn(256, 256, device="cuda")
            (x @ x).sum().item()
    report = profiler.stop()
    trace = _load(tmp_path / "actor_step1_rank0.pt.trace.json.gz")
    assert any(e.get("cat") == "kernel" for e in trace["traceEvents"])
    assert any(v[3] > 0 for v in report["actor"]["ops"].values())  # self device time
    snapshot = tmp_path / "torch_memory" / "step1" / "rank0.pickle"
    assert report["critic"]["files"] == [str(snapshot)] and snapshot.stat().st_size > 0
    assert report["critic"]["peak_bytes"]["update_critic"] >= 256 * 256 * 4
