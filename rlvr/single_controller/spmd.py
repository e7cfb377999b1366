"""SPMD backend: the worker group of a ``torchrun`` job, where every process runs the driver's code.

torchrun starts one process per rank with ``RANK`` / ``WORLD_SIZE`` / ``MASTER_ADDR`` / ... set, and
each runs the same program (verl's ``torchrun -m verl.trainer.sft_trainer``). :class:`SPMDWorkerGroup`
makes that a worker group like the others, so the same driver code runs on every backend: each
process holds the worker of its own rank; a call dispatches the arguments as the group's mode says
(every process computes the same split, the data being the same everywhere), runs its own rank's
part, then gathers every rank's output over ``torch.distributed`` (``all_gather_object``) and
collects it as the mode says. A rank's exception reaches every rank as a ``WorkerError`` naming it.
Every wait is a collective with the process group's timeout (``call_timeout_s``); a rank that died
is torchrun's to report (it stops the others).

Driver-side effects that must happen once (files, logs) are for :attr:`SPMDWorkerGroup.is_lead`
(rank 0); :meth:`SPMDWorkerGroup.barrier` lines the ranks up after them and
:meth:`SPMDWorkerGroup.from_lead` hands the lead's decisions to the others.
"""

from __future__ import annotations

import os
import traceback
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from rlvr.single_controller.base.worker_group import ClassWithInitArgs, WorkerGroup
from rlvr.utils.errors import WorkerError

__all__ = ["SPMDWorkerGroup", "launched_by_torchrun"]


def launched_by_torchrun() -> int | None:
    """The number of processes torchrun started (``WORLD_SIZE`` beside ``TORCHELASTIC_RUN_ID``), or
    None outside torchrun."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return None
    return int(os.environ["WORLD_SIZE"])


def _join(device: str, timeout_s: float) -> None:
    """Join torchrun's process group through its store (``env://``: torchrun's agent holds the store
    at ``MASTER_PORT``, which a worker's own ``tcp://`` rendezvous would try to bind again); the
    worker's ``init_process_group`` then finds it joined."""
    if dist.is_initialized():
        return
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.startswith("cuda") else "gloo", init_method="env://",
                            timeout=timedelta(seconds=timeout_s))


class SPMDWorkerGroup(WorkerGroup):
    """This process's rank of a torchrun job as a worker group of ``WORLD_SIZE`` workers.

    Args:
        ray_cls_with_init: the worker class and its constructor arguments (built in this process).
        call_timeout_s: timeout of the process group's collectives, hence of every call.
        name_prefix: group name used in error messages.
    """

    def __init__(self, ray_cls_with_init: ClassWithInitArgs, call_timeout_s: float,
                 name_prefix: str | None = None) -> None:
        cls = ray_cls_with_init.cls
        super().__init__(name_prefix or f"{cls.__name__}_spmd", cls, call_timeout_s)
        worker = ray_cls_with_init()
        self.rank = worker.rank
        _join(worker.device, call_timeout_s)  # the gathers below need it before any call
        self._workers = [None] * dist.get_world_size()
        self._workers[self.rank] = worker
        self._bind_worker_methods(cls)

    @property
    def is_lead(self) -> bool:
        """Whether this process does the driver's one-off work (rank 0)."""
        return self.rank == 0

    def barrier(self) -> None:
        """Wait until every rank gets here."""
        dist.barrier()

    def from_lead(self, value: Any) -> Any:
        """The lead's ``value`` on every rank (what the lead decided, e.g. the checkpoint to resume)."""
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def _submit(self, rank: int, method: str, args: tuple, kwargs: dict) -> Any:
        if rank != self.rank:
            return None  # that rank's own process runs it
        try:
            return True, getattr(self._workers[rank], method)(*args, **kwargs)
        except Exception as err:  # reported to every rank by _wait, as a remote error would be
            return False, "".join(traceback.format_exception(err))

    def _wait(self, handles: list, ranks: list[int], method: str, timeout_s: float) -> list:
        own = handles[ranks.index(self.rank)] if self.rank in ranks else None
        gathered: list = [None] * len(self._workers)
        dist.all_gather_object(gathered, own)
        outputs = []
        for rank in ranks:
            ok, value = gathered[rank]
            if not ok:
                raise WorkerError(self.name, method, rank, value)
            outputs.append(value)
        return outputs

    def shutdown(self) -> None:
        """Drop this rank's worker (the process group ends with the process)."""
        self._workers = [None] * len(self._workers)
