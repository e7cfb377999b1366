"""Profiling of training steps (verl's ``verl.utils.profiler`` keys): ``global_profiler`` picks the
tool and the steps, each role's ``profiler`` turns it on for that role.

- :mod:`rlvr.utils.profiler.config`: the config sections (no torch import).
- :mod:`rlvr.utils.profiler.worker`: a worker process's profiler (:class:`WorkerProfiler`).
- :mod:`rlvr.utils.profiler.torch_profile`, :mod:`rlvr.utils.profiler.torch_memory`: the tools.
- :mod:`rlvr.utils.profiler.summary`: the trainer's side (which steps, the top-operator summary).

See ``docs/profiling.md``.
"""

from rlvr.utils.profiler.config import (
    PROFILER_TOOLS,
    GlobalProfilerConfig,
    ProfilerConfig,
    RolloutProfilerConfig,
    TorchMemoryToolConfig,
    TorchProfilerScheduleConfig,
    TorchProfilerToolConfig,
)

__all__ = [
    "PROFILER_TOOLS",
    "GlobalProfilerConfig",
    "ProfilerConfig",
    "RolloutProfilerConfig",
    "TorchMemoryToolConfig",
    "TorchProfilerScheduleConfig",
    "TorchProfilerToolConfig",
]
