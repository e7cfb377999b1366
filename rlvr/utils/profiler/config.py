"""The profiler's config sections, with verl's keys (``global_profiler`` and each role's ``profiler``).

Dataclasses only: the run schema includes them and loading a config must not import torch.

rlvr records with ``torch.profiler`` (``tool: torch``) and torch's memory tools (``tool:
torch_memory``); verl's other tools (``nsys``, ``npu``, ``precision_debugger``) are refused by the
config check with the reason, and their settings are accepted only at their defaults. A role's
``tool``, ``save_path``, memory, ``relocate_results`` and finish-hook settings default to
``global_profiler``'s (a finish-hook or relocate setting left None takes the global one), and the
rollout's ``enable`` / ``ranks`` / finish-hook settings to the actor's, as in verl.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from rlvr.utils.config_field import config_field as _f

__all__ = [
    "GlobalNsightToolConfig",
    "GlobalProfilerConfig",
    "GlobalToolConfig",
    "GlobalTorchMemoryToolConfig",
    "NPUToolConfig",
    "NsightToolConfig",
    "PROFILER_TOOLS",
    "PrecisionDebuggerToolConfig",
    "ProfilerConfig",
    "REFUSED_TOOLS",
    "RolloutProfilerConfig",
    "RolloutToolConfig",
    "RolloutTorchProfilerToolConfig",
    "TORCH_CONTENTS",
    "ToolConfig",
    "TorchMemoryToolConfig",
    "TorchProfilerScheduleConfig",
    "TorchProfilerToolConfig",
]

PROFILER_TOOLS = ("torch", "torch_memory")
"""The tools rlvr runs."""

REFUSED_TOOLS = {
    "nsys": "Nsight Systems needs NVIDIA's nsys and Ray's nsight runtime environment, which rlvr does not set up",
    "npu": "Ascend NPUs and torch_npu are not supported by rlvr",
    "precision_debugger": "msprobe's precision debugger is for Ascend NPUs, which rlvr does not support",
}
"""verl's tools that rlvr does not run, with the reason."""

TORCH_CONTENTS = ("cuda", "cpu", "memory", "shapes", "stack")
"""What ``tool_config.torch.contents`` may list (empty = everything)."""

_GLOBAL = "global_profiler"
_GLOBAL_MEMORY = f"{_GLOBAL}.global_tool_config.torch_memory"
_ACTOR = "actor_rollout_ref.actor.profiler"


def _sub(cls: type, help: str) -> Any:  # noqa: A002
    return field(default_factory=cls, metadata={"help": help})


# ------------------------------------------------------------------------------ per-role tools
@dataclass
class NsightToolConfig:
    discrete: bool = _f(f"${{oc.select:{_GLOBAL}.global_tool_config.nsys.discrete,false}}", "verl's nsys setting (tool nsys is refused: only the default is accepted)")


@dataclass
class NPUToolConfig:
    contents: list = _f([], "verl's Ascend NPU profiler contents (tool npu is refused: only the default is accepted)")
    level: str = _f("level0", "verl's NPU collection level (only the default is accepted)")
    analysis: bool = _f(True, "verl's NPU automatic analysis (only the default is accepted)")
    discrete: bool = _f(False, "verl's NPU per-task databases (only the default is accepted)")


@dataclass
class TorchProfilerScheduleConfig:
    skip_first: int = _f(0, "verl's update mini-batch schedule; rlvr records whole stages, so only 0 is accepted")
    wait: int = _f(0, "verl's update mini-batch schedule; only 0 is accepted")
    warmup: int = _f(0, "verl's update mini-batch schedule; only 0 is accepted")
    active: int = _f(0, "verl's update mini-batch schedule (0 = record every mini-batch); only 0 is accepted")
    repeat: int = _f(0, "verl's update mini-batch schedule; only 0 is accepted")


@dataclass
class TorchProfilerToolConfig:
    contents: list = _f([], "what torch.profiler records beside CPU activity: cuda (device kernels), memory (allocations per op), shapes, stack (Python stacks); [] = CPU and device activity only")
    discrete: bool = _f(False, "one trace per stage call (gen, old_log_prob, update_actor, ...) instead of one per role and step")
    schedule: TorchProfilerScheduleConfig = _sub(TorchProfilerScheduleConfig, "verl's mini-batch sub-sampling of the update loop (not supported: whole stages are recorded)")


@dataclass
class TorchMemoryToolConfig:
    trace_alloc_max_entries: int = _f(f"${{oc.select:{_GLOBAL_MEMORY}.trace_alloc_max_entries,100000}}", "set it in global_profiler.global_tool_config.torch_memory (the allocator history is one per process)")
    stack_depth: int = _f(f"${{oc.select:{_GLOBAL_MEMORY}.stack_depth,32}}", "set it in global_profiler.global_tool_config.torch_memory")
    memory_snapshot_num_steps: int = _f(f"${{oc.select:{_GLOBAL_MEMORY}.memory_snapshot_num_steps,1}}", "set it in global_profiler.global_tool_config.torch_memory")


@dataclass
class PrecisionDebuggerToolConfig:
    config_path: Optional[str] = _f(None, "verl's msprobe config (tool precision_debugger is refused: only the default is accepted)")
    steps: Optional[list] = _f(None, "verl's msprobe steps (deprecated in verl; only the default is accepted)")
    stages: Optional[list] = _f(None, "verl's msprobe stages (only the default is accepted)")
    strict: bool = _f(False, "verl's msprobe strict mode (only the default is accepted)")


@dataclass
class ToolConfig:
    nsys: NsightToolConfig = _sub(NsightToolConfig, "Nsight Systems (refused)")
    npu: NPUToolConfig = _sub(NPUToolConfig, "Ascend NPU profiler (refused)")
    torch: TorchProfilerToolConfig = _sub(TorchProfilerToolConfig, "torch.profiler: what to record, one trace per stage or per role and step")
    torch_memory: TorchMemoryToolConfig = _sub(TorchMemoryToolConfig, "memory snapshots (settings from global_profiler)")
    precision_debugger: PrecisionDebuggerToolConfig = _sub(PrecisionDebuggerToolConfig, "msprobe (refused)")


@dataclass
class ProfilerConfig:
    """A role's profiler (``actor_rollout_ref.{actor,ref,rollout}.profiler``, ``critic.profiler``)."""

    tool: Optional[str] = _f(f"${{oc.select:{_GLOBAL}.tool,null}}", "torch | torch_memory (default: global_profiler.tool)")
    enable: bool = _f(False, "profile this role in the steps of global_profiler.steps")
    all_ranks: bool = _f(False, "profile every rank of the role's workers")
    ranks: list = _f([], "ranks to profile ([] with all_ranks false: rank 0)")
    save_path: Optional[str] = _f(f"${{oc.select:{_GLOBAL}.save_path,null}}", "folder of the traces (default: global_profiler.save_path)")
    relocate_results: Optional[bool] = _f(None, "verl moves nsys / engine traces into save_path; rlvr writes every trace there already (None: global_profiler's)")
    finish_hook_cmd: Optional[str] = _f(None, "shell command run once after the last profiled step on the hook ranks, env VERL_PROFILE_SAVE_PATH, _TOOL, _RANK, _PID, _ROLE (None: global_profiler's)")
    finish_hook_all_ranks: Optional[bool] = _f(None, "run finish_hook_cmd on every rank (None: global_profiler's)")
    finish_hook_ranks: Optional[list] = _f(None, "ranks that run finish_hook_cmd, [] = the profiled ranks (None: global_profiler's)")
    tool_config: ToolConfig = _sub(ToolConfig, "per-tool settings")


@dataclass
class RolloutTorchProfilerToolConfig(TorchProfilerToolConfig):
    contents: list = _f(f"${{oc.select:{_ACTOR}.tool_config.torch.contents,[]}}", "what torch.profiler records during generation (default: the actor's contents)")
    discrete: bool = _f(f"${{oc.select:{_ACTOR}.tool_config.torch.discrete,false}}", "one trace per generation call (default: the actor's discrete)")


@dataclass
class RolloutToolConfig(ToolConfig):
    torch: RolloutTorchProfilerToolConfig = _sub(RolloutTorchProfilerToolConfig, "torch.profiler settings of generation (default: the actor's)")


@dataclass
class RolloutProfilerConfig(ProfilerConfig):
    """The rollout's profiler: ``enable``, ranks and hook settings default to the actor's."""

    enable: bool = _f(f"${{oc.select:{_ACTOR}.enable,false}}", "profile generation in the profiled steps (default: the actor's enable)")
    all_ranks: bool = _f(f"${{oc.select:{_ACTOR}.all_ranks,false}}", "profile every rank (default: the actor's)")
    ranks: list = _f(f"${{oc.select:{_ACTOR}.ranks,[]}}", "ranks to profile (default: the actor's)")
    relocate_results: Optional[bool] = _f(f"${{oc.select:{_ACTOR}.relocate_results,null}}", "default: the actor's (nothing to relocate in rlvr)")
    finish_hook_cmd: Optional[str] = _f(f"${{oc.select:{_ACTOR}.finish_hook_cmd,null}}", "default: the actor's finish_hook_cmd")
    finish_hook_all_ranks: Optional[bool] = _f(f"${{oc.select:{_ACTOR}.finish_hook_all_ranks,null}}", "default: the actor's")
    finish_hook_ranks: Optional[list] = _f(f"${{oc.select:{_ACTOR}.finish_hook_ranks,null}}", "default: the actor's")
    tool_config: RolloutToolConfig = _sub(RolloutToolConfig, "per-tool settings (torch: the actor's by default)")


# ---------------------------------------------------------------------------------- global
@dataclass
class GlobalNsightToolConfig:
    discrete: bool = _f(False, "verl's nsys setting (tool nsys is refused: only the default is accepted)")
    controller_nsight_options: dict = _f({"trace": "cuda,nvtx,cublas,ucx", "cuda-memory-usage": "true",
                                          "cuda-graph-trace": "graph"}, "verl's nsys options of the driver (only the default is accepted)")
    worker_nsight_options: dict = _f({"trace": "cuda,nvtx,cublas,ucx", "cuda-memory-usage": "true",
                                      "cuda-graph-trace": "graph", "capture-range": "cudaProfilerApi",
                                      "capture-range-end": None, "kill": "none"}, "verl's nsys options of the workers (only the default is accepted)")


@dataclass
class GlobalTorchMemoryToolConfig:
    trace_alloc_max_entries: int = _f(100000, "CUDA: allocation events kept in the allocator history (torch.cuda.memory._record_memory_history max_entries)")
    stack_depth: int = _f(32, "verl's stack depth; torch 2.13 records whole stacks, so only 32 (the default) is accepted")
    memory_snapshot_num_steps: int = _f(1, "profiled steps per memory snapshot (a snapshot covers this many profiled steps)")
    context: str = _f("all", "CUDA: allocator events recorded: all | state | alloc")
    stacks: str = _f("all", "CUDA: stacks recorded with each allocation: all | python")
    kw_args: dict = _f({}, "CUDA: further keyword arguments of torch.cuda.memory._record_memory_history")


@dataclass
class GlobalToolConfig:
    nsys: GlobalNsightToolConfig = _sub(GlobalNsightToolConfig, "Nsight Systems (refused)")
    torch_memory: GlobalTorchMemoryToolConfig = _sub(GlobalTorchMemoryToolConfig, "memory snapshots of tool torch_memory")
    precision_debugger: PrecisionDebuggerToolConfig = _sub(PrecisionDebuggerToolConfig, "msprobe (refused)")


@dataclass
class GlobalProfilerConfig:
    """verl's ``global_profiler``: the tool and the steps every enabled role is profiled in."""

    tool: Optional[str] = _f(None, "torch (torch.profiler Chrome traces per role and step) | torch_memory (memory snapshots) | None (off)")
    steps: Optional[list] = _f(None, "training steps to profile, e.g. [1, 2] (None = none)")
    profile_continuous_steps: bool = _f(False, "consecutive profiled steps share one trace per role (needs tool_config.torch.discrete false)")
    save_path: str = _f("outputs/profile", "folder of the traces, snapshots and the top-operator summary")
    relocate_results: bool = _f(False, "verl moves nsys / engine traces into save_path; rlvr writes every trace there already")
    finish_hook_cmd: Optional[str] = _f(None, "shell command run once after the last profiled step (e.g. an upload of $VERL_PROFILE_SAVE_PATH)")
    finish_hook_all_ranks: bool = _f(False, "run finish_hook_cmd on every rank")
    finish_hook_ranks: list = _f([], "ranks that run finish_hook_cmd ([]: the profiled ranks)")
    global_tool_config: GlobalToolConfig = _sub(GlobalToolConfig, "tool settings shared by every role")
