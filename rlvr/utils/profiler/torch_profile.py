"""``tool: torch``: torch.profiler sessions around a worker's stages, written as Chrome traces.

Each profiled stage call (``gen``, ``old_log_prob``, ``update_actor``, ``ref``, ``values``,
``update_critic``) runs in a torch.profiler session of its own, inside a ``record_function`` range
named ``<role>/<stage>``, so that roles sharing a worker process (the hybrid actor, rollout and
reference) get traces of their own. The sessions of one process share torch's time base, so the
sessions of a role in a step are written as one Chrome trace, in time order with the gaps where the
other roles ran: ``<save_path>/<role>_step<k>_rank<r>.pt.trace.json.gz`` (Perfetto and Chrome's
trace viewer open it; TensorBoard's PyTorch profiler plugin reads ``*.pt.trace.json.gz``). With
``discrete`` every stage call is a file of its own
(``<role>_step<k>_<stage><i>_rank<r>.pt.trace.json.gz``).
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

# torch 2.13 imports this module at the first record_function of a process; inside a session with
# Python stacks (with_stack) its import frames are recorded as "_cupti_monitor.py(0): <name>" with a
# name read from memory that is sometimes undecodable or an unescaped quote, and the session then
# fails to parse (UnicodeDecodeError) or its Chrome trace is not JSON. Imported here, before any
# session, the import is not traced (tests/utils/profiler/test_worker_profiler.py checks both).
import torch.profiler._cupti_monitor  # noqa: F401
from torch.profiler import ProfilerActivity, profile, record_function

__all__ = ["OperatorStats", "merge_chrome_traces", "operator_stats", "start_session", "trace_events"]

OperatorStats = dict[str, list[float]]
"""Operator name -> [calls, self CPU us, CPU total us, self device us, self CPU memory bytes]."""


def start_session(contents: Sequence[str], device: str, with_memory: bool = False) -> profile:
    """A started torch.profiler session recording what ``contents`` lists, as verl reads it: CPU
    activity always (the stage ranges and operator names are CPU events), device kernels on a CUDA
    worker with ``cuda`` or an empty list, and ``shapes`` / ``memory`` (allocations per operator) /
    ``stack`` (Python stacks) only when listed. ``with_memory`` turns on what a memory timeline needs
    (memory, shapes and stacks)."""
    wanted = set(contents)
    activities = [ProfilerActivity.CPU]
    if (not wanted or "cuda" in wanted) and device.startswith("cuda"):
        activities.append(ProfilerActivity.CUDA)
    session = profile(activities=activities, record_shapes=with_memory or "shapes" in wanted,
                      profile_memory=with_memory or "memory" in wanted, with_stack=with_memory or "stack" in wanted)
    session.start()
    return session


def stage_range(role: str, stage: str) -> record_function:
    """The ``<role>/<stage>`` range that marks a stage in the trace."""
    return record_function(f"{role}/{stage}")


def trace_events(session: profile) -> dict[str, Any]:
    """The session's Chrome trace as a dict (``traceEvents`` and torch's header fields)."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "trace.json")
        session.export_chrome_trace(path)
        with open(path, encoding="utf-8") as f:
            return json.load(f)


def merge_chrome_traces(traces: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One Chrome trace of several sessions of the same process: the first one's header, every
    session's events (their timestamps share the process's time base), metadata events once."""
    merged = {key: value for key, value in traces[0].items() if key != "traceEvents"}
    events, seen_metadata = [], set()
    for trace in traces:
        for event in trace["traceEvents"]:
            if event.get("ph") == "M":
                key = (event.get("name"), event.get("pid"), event.get("tid"), json.dumps(event.get("args"), sort_keys=True))
                if key in seen_metadata:
                    continue
                seen_metadata.add(key)
            events.append(event)
    merged["traceEvents"] = events
    return merged


def write_trace(trace: dict[str, Any], path: Path) -> Path:
    """Write a Chrome trace as gzipped JSON (written whole to a temporary name, then renamed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with gzip.open(tmp, "wt", encoding="utf-8") as f:
        json.dump(trace, f)
    os.replace(tmp, path)
    return path


def operator_stats(session: profile) -> OperatorStats:
    """Per operator of the session: calls, self / total CPU time, self device time (us) and the CPU
    memory it allocated itself (bytes)."""
    stats: OperatorStats = {}
    for event in session.key_averages():
        device_us = float(getattr(event, "self_device_time_total", 0.0) or 0.0)
        stats[event.key] = [float(event.count), float(event.self_cpu_time_total), float(event.cpu_time_total),
                            device_us, float(event.self_cpu_memory_usage)]
    return stats


def add_stats(total: OperatorStats, more: OperatorStats) -> None:
    """Add ``more`` into ``total`` (in place)."""
    for name, values in more.items():
        if name in total:
            total[name] = [a + b for a, b in zip(total[name], values)]
        else:
            total[name] = list(values)


def cuda_memory_peak(device: str) -> float:
    """Bytes allocated at the peak since torch's last reset of the peak statistics (0 off CUDA)."""
    return float(torch.cuda.max_memory_allocated(device)) if device.startswith("cuda") else 0.0
