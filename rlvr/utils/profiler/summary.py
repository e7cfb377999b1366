"""The trainer's side of profiling: start and stop the workers' profilers around the steps of
``global_profiler.steps`` and, at the end, the top operators per role.

The summary (printed at the end of the run and written to ``<save_path>/summary.txt``) lists, per
role, the stage calls recorded, the files written and the operators that took the most self device
time (CUDA), self CPU time (CPU), or, for ``torch_memory`` on CPU, allocated the most memory,
summed over the profiled steps and ranks.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from rlvr.utils.profiler.config import PROFILER_TOOLS, GlobalProfilerConfig, ProfilerConfig
from rlvr.utils.profiler.torch_profile import OperatorStats, add_stats
from rlvr.utils.profiler.worker import STAGE_ROLES, role_profiler_config

__all__ = ["StepProfiler", "format_summary", "merge_reports", "resolve_save_paths", "startup_notes"]

logger = logging.getLogger(__name__)

ROLES = ("actor", "rollout", "ref", "critic")
TOP_OPERATORS = 10
"""Operators listed per role in the summary."""

CALLS, SELF_CPU, TOTAL_CPU, SELF_DEVICE, SELF_MEMORY = range(5)


def resolve_save_paths(config: Any) -> None:
    """Make ``global_profiler.save_path`` and each role's ``profiler.save_path`` absolute (relative to
    the driver's working directory), so that workers in other processes (Ray actors, whose working
    directory is Ray's) write where the driver reads."""
    shared: GlobalProfilerConfig = config.global_profiler
    shared.save_path = str(Path(shared.save_path).resolve())
    for role in ROLES:
        section = role_profiler_config(config, role)
        if section.save_path is not None:
            section.save_path = str(Path(section.save_path).resolve())


def _relocates(section: ProfilerConfig, shared: GlobalProfilerConfig) -> bool:
    """A role's ``relocate_results``, or the global one where the role leaves it None."""
    return bool(section.relocate_results if section.relocate_results is not None else shared.relocate_results)


def startup_notes(config: Any, device: str) -> list[str]:
    """What the profiling settings do here that a verl user might expect otherwise."""
    shared: GlobalProfilerConfig = config.global_profiler
    sections = [role_profiler_config(config, role) for role in ROLES]
    profiled = [s for s in sections if s.enable and s.tool in PROFILER_TOOLS]
    notes = []
    if any(_relocates(section, shared) for section in profiled):
        notes.append("profiler: relocate_results has nothing to move: rlvr writes every trace straight into save_path")
    if device == "cpu" and any(s.tool == "torch_memory" for s in profiled):
        memory = shared.global_tool_config.torch_memory
        notes.append(
            "profiler: torch_memory on CPU: the allocator history is CUDA-only, so its settings (trace_alloc_max_entries="
            f"{memory.trace_alloc_max_entries}, context={memory.context}, stacks={memory.stacks}, kw_args="
            f"{dict(memory.kw_args)}, memory_snapshot_num_steps={memory.memory_snapshot_num_steps}) apply on CUDA only; "
            "here each profiled stage is recorded with torch.profiler(profile_memory=True) and written as a memory timeline")
    return notes


class StepProfiler:
    """Which steps are profiled, the calls that start and stop the workers' profilers, and the summary.

    Args:
        config: the whole run config.
        device: ``cpu`` or ``cuda`` (the workers' device), for the start-up notes.
    """

    def __init__(self, config: Any, device: str) -> None:
        shared: GlobalProfilerConfig = config.global_profiler
        self.roles = [role for role in ROLES
                      if role_profiler_config(config, role).enable and role_profiler_config(config, role).tool in PROFILER_TOOLS]
        self.steps = sorted(set(int(s) for s in shared.steps)) if shared.steps and self.roles else []
        self.continuous = bool(shared.profile_continuous_steps)
        self.save_path = Path(shared.save_path)
        self.tool = shared.tool
        self.reports: list[dict[str, dict[str, Any]]] = []
        for note in startup_notes(config, device) if self.steps else []:
            logger.warning(note)

    def profiles(self, step: int) -> bool:
        return step in self.steps

    def start(self, groups: Iterable[Any], step: int) -> None:
        """Before training step ``step``: the workers of ``groups`` record it."""
        if self.profiles(step):
            for group in groups:
                group.start_profile(step)

    def stop(self, groups: Iterable[Any], step: int, is_last: bool) -> None:
        """After training step ``step``: traces are written unless the next step continues them
        (``profile_continuous_steps``); after the last profiled step the finish hooks run."""
        if not self.profiles(step):
            return
        last = is_last or step == self.steps[-1]
        flush = last or not (self.continuous and step + 1 in self.steps)
        for group in groups:
            self.reports.extend(group.stop_profile(flush, last))

    def finish(self, write: Any = print) -> str | None:
        """Print the summary (``write``) and save it as ``<save_path>/summary.txt``; None when
        nothing was profiled."""
        if not self.reports:
            return None
        text = format_summary(merge_reports(self.reports), self.tool, self.steps, self.save_path)
        self.save_path.mkdir(parents=True, exist_ok=True)
        (self.save_path / "summary.txt").write_text(text + "\n", encoding="utf-8")
        for line in text.splitlines():
            write(line)
        return text


def merge_reports(reports: Sequence[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """The workers' per-rank, per-stop reports summed per role (operators and calls added, peaks
    the maximum, files and hook results listed)."""
    merged: dict[str, dict[str, Any]] = {}
    for report in reports:
        for role, part in report.items():
            into = merged.setdefault(role, {"tool": part["tool"], "calls": {}, "ops": {}, "peak_bytes": {},
                                            "files": [], "hooks": []})
            for stage, count in part["calls"].items():
                into["calls"][stage] = into["calls"].get(stage, 0) + count
            add_stats(into["ops"], part["ops"])
            for stage, peak in part["peak_bytes"].items():
                into["peak_bytes"][stage] = max(into["peak_bytes"].get(stage, 0.0), peak)
            into["files"] += part["files"]
            into["hooks"] += part["hooks"]
    return merged


def _is_operator(name: str, stage_ranges: set[str]) -> bool:
    """An operator (``aten::mm``, a kernel, a user range), not rlvr's stage range nor a Python frame
    (``file.py(12): fn``, ``<built-in method ...>``, recorded with ``stack`` in the contents)."""
    return name not in stage_ranges and ".py(" not in name and not name.startswith("<built-in")


def _operators(ops: OperatorStats, role: str, key: int) -> list[tuple[str, list[float]]]:
    """The role's operators with a positive ``key`` column, largest first."""
    stage_ranges = {f"{r}/{stage}" for stage, r in STAGE_ROLES.items() if r == role}
    rows = [(name, values) for name, values in ops.items() if _is_operator(name, stage_ranges) and values[key] > 0]
    return sorted(rows, key=lambda row: -row[1][key])


def _role_lines(role: str, part: dict[str, Any]) -> list[str]:
    calls = ", ".join(f"{stage} x{count}" for stage, count in sorted(part["calls"].items()))
    lines = [f"{role} ({part['tool']}): {calls or 'no stage ran'}; {len(part['files'])} file(s)"]
    ops = part["ops"]
    if part["peak_bytes"]:
        lines += [f"    peak allocated in {stage}: {peak / 2**20:.1f} MiB"
                  for stage, peak in sorted(part["peak_bytes"].items())]
    if ops and part["tool"] == "torch_memory":
        lines.append(f"    {'self alloc MiB':>14}  {'calls':>6}  operator")
        lines += [f"    {v[SELF_MEMORY] / 2**20:>14.2f}  {int(v[CALLS]):>6}  {name}"
                  for name, v in _operators(ops, role, SELF_MEMORY)[:TOP_OPERATORS]]
    elif ops:
        device = any(v[SELF_DEVICE] > 0 for v in ops.values())
        key, label = (SELF_DEVICE, "self device ms") if device else (SELF_CPU, "self CPU ms")
        rows = _operators(ops, role, key)
        total = sum(v[key] for _, v in rows) or 1.0
        lines.append(f"    {label:>14}  {'share':>6}  {'calls':>6}  operator")
        lines += [f"    {v[key] / 1000:>14.2f}  {v[key] / total:>6.1%}  {int(v[CALLS]):>6}  {name}"
                  for name, v in rows[:TOP_OPERATORS]]
    for hook in part["hooks"]:
        status = "timed out" if hook["exit_code"] is None else f"exit {hook['exit_code']}"
        lines.append(f"    finish_hook_cmd on rank {hook['rank']}: {status}")
    return lines


def format_summary(merged: dict[str, dict[str, Any]], tool: str | None, steps: Sequence[int], save_path: Path) -> str:
    """The summary text of :func:`merge_reports`' result."""
    lines = [f"profiler ({tool}) over steps {list(steps)}: files under {save_path}"]
    for role in ROLES:
        if role in merged:
            lines += _role_lines(role, merged[role])
    return "\n".join(lines)
