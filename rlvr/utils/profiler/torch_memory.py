"""``tool: torch_memory``: memory snapshots of a worker's profiled steps.

On CUDA this is the allocator's history (``torch.cuda.memory._record_memory_history``, with the
``<role>/<stage>`` ranges as annotations), dumped after ``memory_snapshot_num_steps`` profiled steps
as ``<save_path>/torch_memory/step<k>/rank<r>.pickle`` (``steps<a>-<b>`` for several steps): drop it
on https://pytorch.org/memory_viz.

The allocator history exists for CUDA devices only. On CPU, rlvr records each profiled stage with
``torch.profiler`` and ``profile_memory`` (every allocation and free of every operator, with shapes
and stacks) and writes torch's memory timeline of it, the bytes alive over time by category
(parameters, optimizer state, gradients, activations, ...), as
``<save_path>/torch_memory/step<k>/<role>_<stage><i>_rank<r>.memory_timeline.json`` (``[times_us,
[bytes per category, ...]]``; torch marks this export deprecated in favour of the CUDA-only snapshot,
for which CPU has no counterpart). The summary then lists the operators that allocated the most.
"""

from __future__ import annotations

import warnings
from pathlib import Path
import torch
from torch.profiler import profile

from rlvr.utils.profiler.config import GlobalTorchMemoryToolConfig

__all__ = ["MemoryHistory", "write_cpu_memory_timeline"]


class MemoryHistory:
    """The CUDA allocator history of this process over a window of profiled steps.

    Args:
        settings: ``global_profiler.global_tool_config.torch_memory``.
    """

    def __init__(self, settings: GlobalTorchMemoryToolConfig) -> None:
        self.settings = settings
        self.steps: list[int] = []

    @property
    def recording(self) -> bool:
        return bool(self.steps)

    def begin_step(self, step: int) -> None:
        """Start the history at the first step of a window; later steps extend it."""
        if not self.steps:
            s = self.settings
            torch.cuda.memory._record_memory_history(enabled="all", context=s.context, stacks=s.stacks,
                                                     max_entries=int(s.trace_alloc_max_entries),
                                                     global_record_annotations=True, **dict(s.kw_args))
        self.steps.append(step)

    def end_step(self, folder: Path, rank: int) -> Path | None:
        """After a profiled step: dump and stop once the window holds ``memory_snapshot_num_steps``
        steps; returns the snapshot written, or None while the window goes on."""
        if len(self.steps) < int(self.settings.memory_snapshot_num_steps):
            return None
        first, last = self.steps[0], self.steps[-1]
        window = f"step{first}" if first == last else f"steps{first}-{last}"
        path = folder / "torch_memory" / window / f"rank{rank}.pickle"
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.cuda.synchronize()
        torch.cuda.memory._dump_snapshot(str(path))
        torch.cuda.memory._record_memory_history(enabled=None)
        self.steps = []
        return path


def write_cpu_memory_timeline(session: profile, path: Path) -> Path:
    """torch's memory timeline of a finished session (recorded with memory, shapes and stacks) as JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():  # deprecated for the CUDA snapshot, which has no CPU counterpart
        warnings.simplefilter("ignore", FutureWarning)
        session.export_memory_timeline(str(path), device="cpu")
    return path
