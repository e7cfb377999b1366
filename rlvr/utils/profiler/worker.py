"""The profiler of one worker process: which of its roles it profiles, around which stages.

A worker plays one or more roles (the hybrid worker: actor, rollout, reference; the critic worker:
critic). A role is profiled on a rank when its ``profiler.enable`` is on, its ``tool`` is ``torch`` or
``torch_memory`` and the rank is selected (``all_ranks``, ``ranks``, else rank 0). The trainer calls
:meth:`WorkerProfiler.start` before a step of ``global_profiler.steps`` and :meth:`WorkerProfiler.stop`
after it; in between every stage the worker times (:data:`STAGE_ROLES`) is recorded for its role
(:mod:`rlvr.utils.profiler.torch_profile`, :mod:`rlvr.utils.profiler.torch_memory`). ``stop``
returns what the role's stages did (top operators, files written) for the trainer's summary.
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rlvr.utils.profiler.config import PROFILER_TOOLS, GlobalProfilerConfig, ProfilerConfig
from rlvr.utils.profiler.torch_memory import MemoryHistory, write_cpu_memory_timeline
from rlvr.utils.profiler.torch_profile import (
    OperatorStats,
    add_stats,
    cuda_memory_peak,
    merge_chrome_traces,
    operator_stats,
    stage_range,
    start_session,
    trace_events,
    write_trace,
)

__all__ = ["FINISH_HOOK_TIMEOUT_S", "STAGE_ROLES", "WorkerProfiler", "role_profiler_config"]

logger = logging.getLogger(__name__)

STAGE_ROLES = {"gen": "rollout", "old_log_prob": "actor", "update_actor": "actor", "ref": "ref",
               "values": "critic", "update_critic": "critic"}
"""The role each timed worker stage belongs to."""

FINISH_HOOK_TIMEOUT_S = 3600.0
"""Time limit of ``finish_hook_cmd`` (an upload of the traces)."""


def role_profiler_config(config: Any, role: str) -> ProfilerConfig:
    """The ``profiler`` section of ``role`` (actor / rollout / ref / critic) in the run config."""
    if role == "critic":
        return config.critic.profiler
    return getattr(config.actor_rollout_ref, role).profiler


def _rank_selected(section: ProfilerConfig, rank: int) -> bool:
    if section.all_ranks:
        return True
    return rank in list(section.ranks) if len(section.ranks) else rank == 0


def hook_settings(section: ProfilerConfig, shared: GlobalProfilerConfig) -> tuple[str | None, bool, list[int]]:
    """``(finish_hook_cmd, finish_hook_all_ranks, finish_hook_ranks)`` of a role: its own, or
    ``global_profiler``'s where it leaves one None."""
    command = section.finish_hook_cmd if section.finish_hook_cmd is not None else shared.finish_hook_cmd
    all_ranks = section.finish_hook_all_ranks if section.finish_hook_all_ranks is not None else shared.finish_hook_all_ranks
    ranks = section.finish_hook_ranks if section.finish_hook_ranks is not None else shared.finish_hook_ranks
    return command, bool(all_ranks), [int(r) for r in ranks]


class _Role:
    """A profiled role's settings and what it recorded since the last :meth:`WorkerProfiler.stop`."""

    def __init__(self, name: str, section: ProfilerConfig) -> None:
        self.name, self.section = name, section
        self.tool = section.tool
        self.save_path = Path(section.save_path)
        self.contents = list(section.tool_config.torch.contents)
        self.discrete = bool(section.tool_config.torch.discrete)
        self.traces: list[dict] = []
        self.steps: list[int] = []
        self.stats: OperatorStats = {}
        self.calls: Counter[str] = Counter()
        self.files: list[str] = []
        self.peak_bytes: dict[str, float] = {}


class WorkerProfiler:
    """Profiling of one worker process's roles.

    Args:
        config: the whole run config.
        roles: the roles this worker plays (``actor``, ``rollout``, ``ref``, ``critic``).
        rank: the worker's rank in its group.
        device: ``cpu`` or ``cuda:<i>``.
    """

    def __init__(self, config: Any, roles: Sequence[str], rank: int, device: str) -> None:
        self.rank, self.device = rank, device
        self.shared = config.global_profiler
        self.enabled = {role: role_profiler_config(config, role) for role in roles
                        if role_profiler_config(config, role).enable}
        self.roles = {role: _Role(role, section) for role, section in self.enabled.items()
                      if section.tool in PROFILER_TOOLS and _rank_selected(section, rank)}
        self.step: int | None = None
        self.memory_history = (MemoryHistory(self.shared.global_tool_config.torch_memory)
                               if device.startswith("cuda") else None)

    def start(self, step: int) -> None:
        """Record this process's stages of training step ``step``."""
        self.step = step
        for role in self.roles.values():
            role.steps.append(step)
        if self.memory_history is not None and any(r.tool == "torch_memory" for r in self.roles.values()):
            self.memory_history.begin_step(step)

    @contextmanager
    def stage(self, stage: str) -> Iterator[None]:
        """Record the block as ``stage`` of its role when that role is profiled in the current step."""
        role = self.roles.get(STAGE_ROLES.get(stage, ""))
        if self.step is None or role is None:
            yield
            return
        role.calls[stage] += 1
        if role.tool == "torch_memory" and self.memory_history is not None:
            with stage_range(role.name, stage):
                yield
            role.peak_bytes[stage] = max(role.peak_bytes.get(stage, 0.0), cuda_memory_peak(self.device))
            return
        memory = role.tool == "torch_memory"
        session = start_session([] if memory else role.contents, self.device, with_memory=memory)
        try:
            with stage_range(role.name, stage):
                yield
        finally:
            session.stop()
        add_stats(role.stats, operator_stats(session))
        self._keep(role, stage, session, memory)

    def _keep(self, role: _Role, stage: str, session: Any, memory: bool) -> None:
        folder, call = role.save_path, f"{stage}{role.calls[stage]}"
        if memory:  # CPU: torch's memory timeline of this stage call
            path = folder / "torch_memory" / f"step{self.step}" / f"{role.name}_{call}_rank{self.rank}.memory_timeline.json"
            role.files.append(str(write_cpu_memory_timeline(session, path)))
        elif role.discrete:
            path = folder / f"{role.name}_step{self.step}_{call}_rank{self.rank}.pt.trace.json.gz"
            role.files.append(str(write_trace(trace_events(session), path)))
        else:
            role.traces.append(trace_events(session))

    def stop(self, flush: bool = True, run_hook: bool = False) -> dict[str, dict[str, Any]]:
        """End the profiled step. ``flush`` writes the traces of the steps since the last flush (one
        per role; several steps with ``profile_continuous_steps``); ``run_hook`` runs the roles'
        ``finish_hook_cmd`` (after the last profiled step).

        Returns:
            role -> ``{"tool", "steps", "calls", "ops", "peak_bytes", "files", "hooks"}`` of what this rank
            recorded since the last stop (``ops``: :data:`~rlvr.utils.profiler.torch_profile.OperatorStats`).
        """
        self.step = None
        snapshot = None
        if self.memory_history is not None and self.memory_history.recording:
            snapshot = self.memory_history.end_step(self._snapshot_folder(), self.rank)
        report = {}
        for role in self.roles.values():
            if flush and role.traces:
                first, last = role.steps[0], role.steps[-1]
                steps = f"step{first}" if first == last else f"steps{first}-{last}"
                path = role.save_path / f"{role.name}_{steps}_rank{self.rank}.pt.trace.json.gz"
                role.files.append(str(write_trace(merge_chrome_traces(role.traces), path)))
                role.traces = []
            if snapshot is not None and role.tool == "torch_memory":
                role.files.append(str(snapshot))
            report[role.name] = {"tool": role.tool, "steps": list(role.steps), "calls": dict(role.calls),
                                 "ops": role.stats, "peak_bytes": dict(role.peak_bytes), "files": role.files,
                                 "hooks": []}
            role.stats, role.calls, role.files, role.peak_bytes = {}, Counter(), [], {}
            if flush:
                role.steps = []
        if run_hook:
            self._run_finish_hooks(report)
        return report

    def _snapshot_folder(self) -> Path:
        """Folder of the CUDA memory snapshots: the save path of the first role that takes them."""
        return next(r.save_path for r in self.roles.values() if r.tool == "torch_memory")

    def _run_finish_hooks(self, report: dict[str, dict[str, Any]]) -> None:
        """Each distinct ``finish_hook_cmd`` of this process's enabled roles, once, on the hook ranks."""
        done: set[str] = set()
        for name, section in self.enabled.items():
            command, all_ranks, ranks = hook_settings(section, self.shared)
            if not command or command in done:
                continue
            here = all_ranks or (self.rank in ranks if ranks else name in self.roles)
            if not here:
                continue
            done.add(command)
            result = _run_hook(command, section, name, self.rank)
            report.setdefault(name, {"tool": section.tool, "steps": [], "calls": {}, "ops": {}, "peak_bytes": {},
                                     "files": [], "hooks": []})["hooks"].append(result)


def _run_hook(command: str, section: ProfilerConfig, role: str, rank: int) -> dict[str, Any]:
    """Run ``command`` in a shell with verl's ``VERL_PROFILE_*`` variables; returns its exit code and
    the end of its output (a command that fails or runs past the limit is reported, not raised: the
    traces are written already and training goes on)."""
    env = {**os.environ, "VERL_PROFILE_SAVE_PATH": str(section.save_path or ""), "VERL_PROFILE_TOOL": str(section.tool),
           "VERL_PROFILE_RANK": str(rank), "VERL_PROFILE_PID": str(os.getpid()), "VERL_PROFILE_ROLE": role}
    try:
        done = subprocess.run(["/bin/sh", "-c", command], env=env, capture_output=True, text=True,
                              timeout=FINISH_HOOK_TIMEOUT_S)
        code, output = done.returncode, (done.stdout + done.stderr)[-2000:]
    except subprocess.TimeoutExpired as err:
        code, output = None, f"stopped after {FINISH_HOOK_TIMEOUT_S:.0f} s: {str(err.output or '')[-1000:]}"
    if code != 0:
        logger.error("profiler finish_hook_cmd of %s on rank %d %s: %s", role, rank,
                     "timed out" if code is None else f"exited with {code}", output)
    return {"rank": rank, "command": command, "exit_code": code, "output": output}
