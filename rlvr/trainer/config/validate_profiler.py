"""Config checks of profiling (``global_profiler`` and each role's ``profiler``), before anything starts.

rlvr runs the tools ``torch`` and ``torch_memory`` (:mod:`rlvr.utils.profiler`); verl's ``nsys``,
``npu`` and ``precision_debugger`` are refused with the reason, and settings that only those tools or
verl's mini-batch schedule read are accepted at their defaults only, so none is silently ignored.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from rlvr.utils.errors import ConfigError
from rlvr.utils.profiler.config import (
    PROFILER_TOOLS,
    REFUSED_TOOLS,
    TORCH_CONTENTS,
    GlobalNsightToolConfig,
    GlobalProfilerConfig,
    GlobalTorchMemoryToolConfig,
    NPUToolConfig,
    PrecisionDebuggerToolConfig,
    ProfilerConfig,
    ToolConfig,
    TorchMemoryToolConfig,
    TorchProfilerScheduleConfig,
)

__all__ = ["check_profiler"]

ROLE_KEYS = {"actor": "actor_rollout_ref.actor.profiler", "rollout": "actor_rollout_ref.rollout.profiler",
             "ref": "actor_rollout_ref.ref.profiler", "critic": "critic.profiler"}
MEMORY_CONTEXTS = ("all", "state", "alloc")
MEMORY_STACKS = ("all", "python")
TORCH_STACK_DEPTH = 32
"""The only ``stack_depth``: torch 2.13's allocator history records whole stacks."""


def _require(condition: bool, key: str, message: str) -> None:
    if not condition:
        raise ConfigError(key, message)


def _check_tool(tool: Any, key: str) -> None:
    if tool is None or tool in PROFILER_TOOLS:
        return
    if tool in REFUSED_TOOLS:
        raise ConfigError(key, f"tool {tool!r} is not supported: {REFUSED_TOOLS[tool]}; use torch (torch.profiler "
                          "traces: CPU and CUDA activity) or torch_memory (memory snapshots)")
    raise ConfigError(key, f"unknown profiler tool {tool!r}; use one of {PROFILER_TOOLS} (or null: off)")


def _at_default(value: Any, default: Any, key: str, why: str) -> None:
    value = OmegaConf.to_container(value, resolve=True) if isinstance(value, (DictConfig, ListConfig)) else value
    _require(value == default, key, f"{why}; rlvr accepts only the default {default!r} (got {value!r}): remove the key")


def _check_ranks(values: Any, key: str) -> None:
    _require(values is None or all(isinstance(r, int) and r >= 0 for r in values), key,
             f"must be a list of ranks >= 0, got {values}")


def _check_unsupported_settings(tools: ToolConfig, key: str) -> None:
    """Settings that only verl's refused tools or its mini-batch schedule read: defaults only."""
    schedule, plain = tools.torch.schedule, TorchProfilerScheduleConfig()
    for name, value in (("skip_first", schedule.skip_first), ("wait", schedule.wait), ("warmup", schedule.warmup),
                        ("active", schedule.active), ("repeat", schedule.repeat)):
        _at_default(value, getattr(plain, name), f"{key}.tool_config.torch.schedule.{name}",
                    "rlvr records whole stages, not a schedule of update mini-batches")
    npu, npu_default = tools.npu, NPUToolConfig()
    for name, value in (("contents", npu.contents), ("level", npu.level), ("analysis", npu.analysis),
                        ("discrete", npu.discrete)):
        _at_default(value, getattr(npu_default, name), f"{key}.tool_config.npu.{name}", "the npu tool is refused")
    _at_default(tools.nsys.discrete, False, f"{key}.tool_config.nsys.discrete", "the nsys tool is refused")
    _check_precision_debugger(tools.precision_debugger, f"{key}.tool_config.precision_debugger")


def _check_precision_debugger(debugger: PrecisionDebuggerToolConfig, key: str) -> None:
    plain = PrecisionDebuggerToolConfig()
    for name, value in (("config_path", debugger.config_path), ("steps", debugger.steps),
                        ("stages", debugger.stages), ("strict", debugger.strict)):
        _at_default(value, getattr(plain, name), f"{key}.{name}", "the precision_debugger tool is refused")


def _check_role_memory(memory: TorchMemoryToolConfig, shared: GlobalTorchMemoryToolConfig, key: str) -> None:
    """A role's memory settings are the global ones: the allocator history is one per process."""
    for name, value, wanted in (("trace_alloc_max_entries", memory.trace_alloc_max_entries, shared.trace_alloc_max_entries),
                                ("stack_depth", memory.stack_depth, shared.stack_depth),
                                ("memory_snapshot_num_steps", memory.memory_snapshot_num_steps,
                                 shared.memory_snapshot_num_steps)):
        _require(value == wanted, f"{key}.tool_config.torch_memory.{name}",
                 f"the memory history is one per process, shared by its roles: set "
                 f"global_profiler.global_tool_config.torch_memory.{name} instead")


def _check_role(cfg: DictConfig, role: str) -> bool:
    """The role's section; returns whether it is profiled (enabled with a tool)."""
    section: ProfilerConfig = OmegaConf.select(cfg, ROLE_KEYS[role])
    key = ROLE_KEYS[role]
    _check_tool(section.tool, f"{key}.tool")
    _check_ranks(section.ranks, f"{key}.ranks")
    _check_ranks(section.finish_hook_ranks, f"{key}.finish_hook_ranks")
    tools = section.tool_config
    _require(all(c in TORCH_CONTENTS for c in tools.torch.contents), f"{key}.tool_config.torch.contents",
             f"{list(tools.torch.contents)} lists unknown contents; use any of {TORCH_CONTENTS}")
    _check_unsupported_settings(tools, key)
    _check_role_memory(tools.torch_memory, cfg.global_profiler.global_tool_config.torch_memory, key)
    profiled = bool(section.enable) and section.tool is not None
    if profiled:
        _require(section.save_path is not None, f"{key}.save_path", "a profiled role needs a folder for its traces")
        _require(not (cfg.global_profiler.profile_continuous_steps and tools.torch.discrete),
                 f"{key}.tool_config.torch.discrete", "global_profiler.profile_continuous_steps joins steps into "
                 "one trace per role, which needs discrete=false")
    return profiled


def _check_global(gp: GlobalProfilerConfig) -> None:
    _check_tool(gp.tool, "global_profiler.tool")
    _require(gp.steps is None or all(isinstance(s, int) and s >= 1 for s in gp.steps), "global_profiler.steps",
             f"must be a list of training steps >= 1 (or null), got {gp.steps}")
    _check_ranks(gp.finish_hook_ranks, "global_profiler.finish_hook_ranks")
    tools, at = gp.global_tool_config, "global_profiler.global_tool_config"
    nsys, nsys_default = tools.nsys, GlobalNsightToolConfig()
    for name, value in (("discrete", nsys.discrete), ("controller_nsight_options", nsys.controller_nsight_options),
                        ("worker_nsight_options", nsys.worker_nsight_options)):
        _at_default(value, getattr(nsys_default, name), f"{at}.nsys.{name}", "the nsys tool is refused")
    _check_precision_debugger(tools.precision_debugger, f"{at}.precision_debugger")
    memory, at = tools.torch_memory, f"{at}.torch_memory"
    _require(memory.trace_alloc_max_entries >= 1, f"{at}.trace_alloc_max_entries", "must be >= 1")
    _require(memory.memory_snapshot_num_steps >= 1, f"{at}.memory_snapshot_num_steps", "must be >= 1 profiled step")
    _require(memory.stack_depth == TORCH_STACK_DEPTH, f"{at}.stack_depth", f"torch's allocator history records whole "
             f"stacks and cannot cut them; only {TORCH_STACK_DEPTH} (the default) is accepted: remove the key")
    _require(memory.context in MEMORY_CONTEXTS, f"{at}.context", f"use one of {MEMORY_CONTEXTS}")
    _require(memory.stacks in MEMORY_STACKS, f"{at}.stacks", f"use one of {MEMORY_STACKS}")


def check_profiler(cfg: DictConfig) -> None:
    """``global_profiler`` and the four roles' ``profiler`` sections (see the module docstring)."""
    gp = cfg.global_profiler
    _check_global(gp)
    profiled = [role for role in ROLE_KEYS if _check_role(cfg, role)]
    if profiled:
        _require(bool(gp.steps), "global_profiler.steps", f"the profiler of {', '.join(profiled)} is enabled but no "
                 "step is chosen; set global_profiler.steps (e.g. [1,2]) or turn the role's profiler.enable off")
    elif gp.tool is not None and gp.steps:
        raise ConfigError("global_profiler.tool", f"tool {gp.tool} with steps {list(gp.steps)} profiles nothing: turn on "
                          "a role's profiler, e.g. actor_rollout_ref.actor.profiler.enable=true")
    rollout_apart = not cfg.actor_rollout_ref.hybrid_engine
    _require(not (rollout_apart and "rollout" in profiled), "actor_rollout_ref.rollout.profiler.enable",
             "a rollout apart from the actor (hybrid_engine=false) generates ahead of the training steps, so its "
             "work is not a step's; profile it in the hybrid worker, or set rollout.profiler.enable=false")
