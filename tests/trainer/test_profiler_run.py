"""global_profiler on a 2-step run of the tiny model: one torch.profiler trace per role and step that
parses as a Chrome trace, torch_memory's memory timelines, the top-operator summary at the end, on
the local and the Ray backend; and the config check of the profiler keys."""

from __future__ import annotations

import gzip
import json

import pytest
from trainer_helpers import tiny_config

from rlvr.trainer.config import validate_config
from rlvr.trainer.main_ppo import run_ppo
from rlvr.utils.errors import ConfigError

PROFILED = {"global_profiler.steps": "[1,2]", "actor_rollout_ref.actor.profiler.enable": True,
            "actor_rollout_ref.ref.profiler.enable": True, "trainer.total_training_steps": 2,
            "trainer.val_before_train": False, "data.val_files": "null", "trainer.report": False,
            "actor_rollout_ref.rollout.n": 2}


def _profile(tiny_model_dir, tiny_data, tmp_path, tool, **extra):
    cfg = tiny_config(tiny_model_dir, tiny_data, tmp_path / "run", **{
        **PROFILED, "global_profiler.tool": tool, "global_profiler.save_path": str(tmp_path / "profile"), **extra})
    run_ppo(cfg)
    return tmp_path / "profile"


def _stage_ranges(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        trace = json.load(f)
    assert trace["traceEvents"] and all("ph" in e for e in trace["traceEvents"])
    return {e["name"] for e in trace["traceEvents"] if e.get("ph") == "X" and e["name"].split("/")[0] in
            ("actor", "rollout", "ref") and "::" not in e["name"]}


def test_torch_traces_per_role_and_step_and_the_summary(tiny_model_dir, tiny_data, tmp_path, capsys):
    out = _profile(tiny_model_dir, tiny_data, tmp_path, "torch")
    expected = {"actor": {"actor/update_actor", "actor/old_log_prob"}, "rollout": {"rollout/gen"}, "ref": {"ref/ref"}}
    traces = sorted(p.name for p in out.glob("*.pt.trace.json.gz"))
    assert traces == [f"{role}_step{step}_rank0.pt.trace.json.gz" for role in ("actor", "ref", "rollout") for step in (1, 2)]
    for role, ranges in expected.items():
        for step in (1, 2):
            assert _stage_ranges(out / f"{role}_step{step}_rank0.pt.trace.json.gz") == ranges
    printed = capsys.readouterr().out
    summary = (out / "summary.txt").read_text()
    assert summary.splitlines()[0] in printed and summary.startswith("profiler (torch) over steps [1, 2]")
    for line in ("actor (torch): old_log_prob x2, update_actor x2; 2 file(s)", "rollout (torch): gen x2; 2 file(s)",
                 "ref (torch): ref x2; 2 file(s)"):
        assert line in summary
    assert "aten::mm" in summary  # the matmuls are among the top operators of every role


@pytest.mark.slow  # torch's memory timeline analysis takes minutes on the tiny run (tests/utils/profiler: seconds)
def test_torch_memory_on_cpu_writes_a_memory_timeline_per_stage(tiny_model_dir, tiny_data, tmp_path):
    out = _profile(tiny_model_dir, tiny_data, tmp_path, "torch_memory", **{"actor_rollout_ref.ref.profiler.enable": False})
    files = sorted(p.relative_to(out / "torch_memory").as_posix() for p in (out / "torch_memory").rglob("*.json"))
    assert files == [f"step{s}/{name}_rank0.memory_timeline.json" for s in (1, 2)
                     for name in ("actor_old_log_prob1", "actor_update_actor1", "rollout_gen1")]
    times, sizes = json.loads((out / "torch_memory" / "step1" / "actor_update_actor1_rank0.memory_timeline.json").read_text())
    assert len(times) == len(sizes) > 0
    assert "self alloc MiB" in (out / "summary.txt").read_text()


@pytest.mark.ray
@pytest.mark.slow  # starts Ray with two workers (about a minute and a half on a loaded 2-core machine)
def test_torch_traces_on_two_ray_workers(tiny_model_dir, tiny_data, tmp_path):
    out = _profile(tiny_model_dir, tiny_data, tmp_path, "torch", **{
        "trainer.backend": "ray", "trainer.n_gpus_per_node": 2, "actor_rollout_ref.actor.profiler.all_ranks": True,
        "global_profiler.steps": "[2]", "actor_rollout_ref.rollout.n": 4})
    assert sorted(p.name for p in out.glob("*.pt.trace.json.gz")) == [
        "actor_step2_rank0.pt.trace.json.gz", "actor_step2_rank1.pt.trace.json.gz", "ref_step2_rank0.pt.trace.json.gz",
        "rollout_step2_rank0.pt.trace.json.gz", "rollout_step2_rank1.pt.trace.json.gz"]
    assert _stage_ranges(out / "actor_step2_rank1.pt.trace.json.gz") == {"actor/update_actor", "actor/old_log_prob"}
    assert "actor (torch): old_log_prob x2, update_actor x2; 2 file(s)" in (out / "summary.txt").read_text()


@pytest.mark.parametrize(("overrides", "key", "message"), [
    (["global_profiler.tool=nsys"], "global_profiler.tool", "Nsight Systems needs"),
    (["global_profiler.tool=torch", "global_profiler.steps=[1]"], "global_profiler.tool", "profiles nothing"),
    (["global_profiler.tool=torch", "actor_rollout_ref.actor.profiler.enable=true"], "global_profiler.steps",
     "no step is chosen"),
    (["actor_rollout_ref.actor.profiler.tool_config.torch.schedule.active=2"],
     "actor_rollout_ref.actor.profiler.tool_config.torch.schedule.active", "whole stages"),
    (["critic.profiler.tool_config.torch_memory.stack_depth=16"], "critic.profiler.tool_config.torch_memory.stack_depth",
     "one per process"),
    (["global_profiler.global_tool_config.torch_memory.stack_depth=16"],
     "global_profiler.global_tool_config.torch_memory.stack_depth", "whole stacks"),
    (["actor_rollout_ref.actor.profiler.tool_config.torch.contents=[gpu]"],
     "actor_rollout_ref.actor.profiler.tool_config.torch.contents", "unknown contents"),
    (["global_profiler.global_tool_config.nsys.discrete=true"], "global_profiler.global_tool_config.nsys.discrete",
     "nsys tool is refused"),
    (["global_profiler.tool=torch", "global_profiler.steps=[1,2]", "global_profiler.profile_continuous_steps=true",
      "actor_rollout_ref.actor.profiler.enable=true", "actor_rollout_ref.actor.profiler.tool_config.torch.discrete=true"],
     "actor_rollout_ref.actor.profiler.tool_config.torch.discrete", "needs discrete=false"),
])
def test_profiler_keys_are_checked(tiny_model_dir, tiny_data, tmp_path, overrides, key, message):
    cfg = tiny_config(tiny_model_dir, tiny_data, tmp_path / "run", **dict(o.split("=", 1) for o in overrides))
    with pytest.raises(ConfigError, match=message) as info:
        validate_config(cfg)
    assert info.value.key == key
