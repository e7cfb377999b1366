"""Local backend: the worker runs inside the driver process, so a breakpoint in a worker method works.

``LocalWorkerGroup`` has the constructor and API of ``RayWorkerGroup`` with world size 1 and the
same dispatch / execute / collect code (``WorkerGroup``). Differences, by necessity:

- A call runs to completion in the calling thread when it is submitted (an ``async def`` method
  in an event loop of its own); a non-blocking call returns a future that is already done. The worker gets a copy of the arguments, as a Ray
  actor does, so changing an input in place does not change the caller's object.
- A running call cannot be interrupted safely inside the driver (and a debugger session must not
  be cut short), so the timeout is checked when the call returns: a call that took longer than
  its timeout raises ``WorkerTimeoutError`` and its result is discarded.
- A worker that kills its process kills the driver; there is no ``WorkerDiedError`` here.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import os
import time
import traceback
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from rlvr.single_controller.base.colocate import create_colocated_worker_cls
from rlvr.single_controller.base.worker import free_port
from rlvr.single_controller.base.worker_group import ClassWithInitArgs, ResourcePool, WorkerGroup, check_device_name
from rlvr.utils.errors import ProtocolError, WorkerError, WorkerTimeoutError

__all__ = ["LocalResourcePool", "LocalWorkerGroup", "create_colocated_worker_cls"]


class LocalResourcePool(ResourcePool):
    """The driver process itself: one worker. Same constructor as ``RayResourcePool``.

    Args:
        process_on_nodes: must be ``[1]``.
        use_gpu: the worker uses the driver's first GPU.
        name_prefix: name used in messages.
        max_colocate_count: worker groups that may share the process.
        detached: must be False (nothing outlives the driver process).
        accelerator_type: unused by one in-process worker; accepted for the shared constructor.
    """

    def __init__(
        self,
        process_on_nodes: Sequence[int] = (1,),
        use_gpu: bool = False,
        name_prefix: str | None = None,
        max_colocate_count: int = 10,
        detached: bool = False,
        accelerator_type: str | None = None,
    ) -> None:
        super().__init__(process_on_nodes, max_colocate_count)
        if self.world_size != 1:
            raise ProtocolError(
                f"the local backend runs one worker in the driver process, but the resource pool asks for "
                f"{self.store} processes per node: set trainer.nnodes=1 and trainer.n_gpus_per_node=1 "
                "(or 0 for CPU), or use trainer.backend=ray"
            )
        if detached:
            raise ProtocolError("a local resource pool cannot be detached: it is the driver process")
        self.use_gpu = use_gpu
        self.name_prefix = name_prefix or "local_pool"
        self.accelerator_type = accelerator_type


@dataclass
class _Done:
    """Outcome of a local call."""

    value: Any
    error: BaseException | None
    elapsed_s: float


@contextmanager
def _worker_env(group: str) -> Iterator[None]:
    """The environment of rank 0 of a group of one, restored afterwards."""
    env = {
        "WG_PREFIX": group,
        "WG_BACKEND": "local",
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "RAY_LOCAL_RANK": "0",
        "RAY_LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k)
            else:
                os.environ[k] = v


class LocalWorkerGroup(WorkerGroup):
    """A worker group of one worker that lives in the driver process (same API as ``RayWorkerGroup``).

    Args:
        resource_pool: a ``LocalResourcePool``.
        ray_cls_with_init: the worker class (plain or wrapped with ``ray.remote``) and its
            constructor arguments.
        bin_pack: nothing to pack for one in-process worker; accepted for the shared constructor.
        name_prefix: group name used in error messages.
        detached: must be False (a local worker cannot outlive the driver).
        call_timeout_s: timeout checked when each call returns (see the module docstring).
        device_name: ``"cuda"`` or ``"cpu"`` (checked against the pool as by ``RayWorkerGroup``; the
            worker picks its device itself).
        worker_env: refused when not empty, as are the ``env_vars`` of a ``ray.remote(runtime_env=...)``
            class: the worker lives in the driver, whose environment is the user's to set.
    """

    def __init__(
        self,
        resource_pool: LocalResourcePool,
        ray_cls_with_init: ClassWithInitArgs,
        bin_pack: bool = True,
        name_prefix: str | None = None,
        detached: bool = False,
        *,
        call_timeout_s: float | None = None,
        device_name: str = "cuda",
        worker_env: dict[str, str] | None = None,
    ) -> None:
        if detached:
            raise ProtocolError("the local backend cannot start detached workers: they live in the driver process")
        if worker_env or ray_cls_with_init.runtime_env:
            raise ProtocolError(
                "the local backend runs the worker in the driver process, so it cannot give it its own environment "
                f"(worker_env={worker_env}, ray.remote runtime_env={ray_cls_with_init.runtime_env}): set the "
                "variables in the driver's environment (os.environ) instead, or use trainer.backend=ray / process"
            )
        cls = ray_cls_with_init.cls
        super().__init__(name_prefix or f"{cls.__name__}_{uuid.uuid4().hex[:6]}", cls, call_timeout_s)
        self.resource_pool = resource_pool
        check_device_name(self.name, device_name, resource_pool.use_gpu)
        with _worker_env(self.name):
            done = self._run(ray_cls_with_init)
        if done.error is not None:
            raise WorkerError(self.name, "__init__", 0, _format(done.error)) from done.error
        self._workers.append(done.value)
        self._bind_worker_methods(cls)

    @staticmethod
    def _run(fn: Any, *args: Any, **kwargs: Any) -> _Done:
        start = time.monotonic()
        try:
            value = fn(*args, **kwargs)
            if inspect.iscoroutine(value):  # an async worker method: run it here, as a Ray actor awaits it
                value = asyncio.run(value)
        except Exception as err:  # reported through WorkerError by _wait, like a remote error
            return _Done(None, err, time.monotonic() - start)
        return _Done(value, None, time.monotonic() - start)

    def _submit(self, rank: int, method: str, args: tuple, kwargs: dict) -> _Done:
        args, kwargs = copy.deepcopy((args, kwargs))  # the worker owns its arguments, as a Ray actor does
        return self._run(getattr(self._workers[rank], method), *args, **kwargs)

    def _wait(self, handles: list, ranks: list[int], method: str, timeout_s: float) -> list:
        outputs = []
        for done, rank in zip(handles, ranks):
            if done.error is not None:
                raise WorkerError(self.name, method, rank, _format(done.error)) from done.error
            if done.elapsed_s > timeout_s:
                raise WorkerTimeoutError(
                    self.name,
                    method,
                    rank,
                    f"the call took {done.elapsed_s:.1f} s, over its timeout of {timeout_s:.1f} s (the local "
                    "backend cannot interrupt a call; it checks the time when the call returns)",
                )
            outputs.append(done.value)
        return outputs

    def shutdown(self) -> None:
        """Drop the worker object."""
        self._workers.clear()
        self._fail(WorkerError(self.name, "shutdown", 0, "the group was shut down"))


def _format(error: BaseException) -> str:
    """The exception with its traceback, as a remote worker would report it."""
    return "".join(traceback.format_exception(error))
