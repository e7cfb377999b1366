"""Process backend: each worker in a child process of the driver, on this machine, without Ray.

The local backend runs its workers inside the driver; a role that must compute *while* the driver's
workers train (the rollout of an asynchronous run, ``actor_rollout_ref.hybrid_engine=false``) gets
a :class:`ProcessWorkerGroup` instead: one child process per rank that serves the worker's
methods over a socket. It has the constructor and API of ``RayWorkerGroup`` and
shares its dispatch / execute / collect code (``WorkerGroup``). A child is a fresh Python
(``python -c``, with the driver's ``sys.path``) talking to the driver over a socket pair; it does not
import the driver's main module (which ``multiprocessing``'s spawn would), but it does import the
user's modules the driver imported (``trainer.user_modules``: a rollout engine, agent loop or tool
of the user's is registered in the child too):

- every wait has a timeout (``WorkerTimeoutError`` naming group, method and rank; the group is then
  unusable and :meth:`ProcessWorkerGroup.shutdown` kills the hung child);
- a child that dies (killed, out of memory, a crash) fails its calls with ``WorkerDiedError``;
- calls may come from several driver threads, and a child runs up to ``max_concurrency`` of them at
  once, each in a thread of its own (a rollout worker takes new weights while it generates);
- arguments and results travel pickled with ``cloudpickle`` (tensors by value), as Ray sends them,
  so functions and classes made at run time (fused role classes, fault-injection subclasses) work;
- a child exits when the driver closes its pipe or dies, so no worker outlives the run.
"""

from __future__ import annotations

import itertools
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle

from rlvr.single_controller.base.worker import free_port
from rlvr.single_controller.base.worker_group import (
    ClassWithInitArgs,
    ResourcePool,
    WorkerGroup,
    check_device_name,
    with_worker_env,
)
from rlvr.utils.errors import ProtocolError, WorkerDiedError, WorkerError, WorkerTimeoutError
from rlvr.utils.registrations import user_code_for_workers

__all__ = ["ProcessResourcePool", "ProcessWorkerGroup"]

_INIT_CALL = 0  # the id of the child's "constructed" reply
_CHILD_CODE = "import sys; from rlvr.single_controller.process import child_main; child_main(int(sys.argv[1]))"


class ProcessResourcePool(ResourcePool):
    """Child processes of the driver on this machine. Same constructor as ``RayResourcePool``.

    Args:
        process_on_nodes: ``[n]``: n worker processes (one node: this machine).
        use_gpu: the workers use this machine's GPUs (rank ``i`` picks ``cuda:<local rank>``).
        name_prefix: name used in messages.
        max_colocate_count: worker groups that may share a process (accepted for the shared constructor).
        detached: must be False (children end with the driver).
        accelerator_type: accepted for the shared constructor; unused.
        start_timeout_s: how long a child may take to import and construct its worker.
    """

    def __init__(self, process_on_nodes: Sequence[int] = (1,), use_gpu: bool = False, name_prefix: str | None = None,
                 max_colocate_count: int = 10, detached: bool = False, accelerator_type: str | None = None, *,
                 start_timeout_s: float = 600.0) -> None:
        super().__init__(process_on_nodes, max_colocate_count)
        if len(self.store) != 1:
            raise ProtocolError(f"a process resource pool lives on this machine (one node); got {self.store} "
                                "processes per node")
        if detached:
            raise ProtocolError("a process resource pool cannot be detached: its processes end with the driver")
        self.use_gpu = use_gpu
        self.name_prefix = name_prefix or "process_pool"
        self.accelerator_type = accelerator_type
        self.start_timeout_s = start_timeout_s


@dataclass
class _Call:
    """One call in flight: done when the child replied (``ok``/``value``) or died (``died``)."""

    rank: int
    method: str
    done: threading.Event = field(default_factory=threading.Event)
    ok: bool = False
    value: Any = None
    died: str | None = None


_GONE_WAIT_S = 10.0
"""How long a call that could not be sent waits for the receiver to learn how the process ended
(it waits up to 5 s for the exit code)."""


@dataclass
class _Child:
    """A worker process, its end of the pipe and the calls it has not answered."""

    process: Any
    conn: Connection
    send_lock: threading.Lock = field(default_factory=threading.Lock)
    calls: dict[int, _Call] = field(default_factory=dict)
    calls_lock: threading.Lock = field(default_factory=threading.Lock)
    exit_reason: str | None = None
    gone: str | None = None  # why the process ended, once its receiver has failed its calls
    gone_event: threading.Event = field(default_factory=threading.Event)


def _class_env_vars(group: str, ray_cls_with_init: ClassWithInitArgs) -> dict[str, str]:
    """The ``env_vars`` of the worker class's ``ray.remote(runtime_env=...)``; any other runtime_env
    field (pip, working_dir, ...) needs Ray and is refused."""
    runtime_env = ray_cls_with_init.runtime_env
    others = sorted(set(runtime_env) - {"env_vars"})
    if others:
        raise ProtocolError(f"worker group '{group}': the process backend cannot apply runtime_env {others} of the "
                            "worker class's ray.remote(...) options (only env_vars); use trainer.backend=ray")
    return dict(runtime_env.get("env_vars") or {})


class ProcessWorkerGroup(WorkerGroup):
    """A group of worker processes, children of the driver (see the module docstring).

    Args:
        resource_pool: a ``ProcessResourcePool``.
        ray_cls_with_init: the worker class (plain or wrapped with ``ray.remote``) and its constructor
            arguments.
        bin_pack: accepted for the shared constructor (one machine).
        name_prefix: group name used in error messages.
        detached: must be False.
        call_timeout_s: timeout of every call (start-up waits ``resource_pool.start_timeout_s``).
        device_name: ``"cuda"`` or ``"cpu"`` (checked against the pool as by ``RayWorkerGroup``).
        max_concurrency: calls each child runs at once (in threads).
        worker_env: extra environment variables of every child (as ``RayWorkerGroup``'s; one the group
            sets itself raises ``ValueError``). A child sees every GPU of the machine, so its
            ``LOCAL_RANK`` is its rank, as under ``torchrun``.
    """

    def __init__(self, resource_pool: ProcessResourcePool, ray_cls_with_init: ClassWithInitArgs, bin_pack: bool = True,
                 name_prefix: str | None = None, detached: bool = False, *, call_timeout_s: float | None = None,
                 device_name: str = "cuda", max_concurrency: int = 1, worker_env: dict[str, str] | None = None) -> None:
        if detached:
            raise ProtocolError("the process backend cannot start detached workers: they end with the driver")
        cls = ray_cls_with_init.cls
        super().__init__(name_prefix or f"{cls.__name__}_{uuid.uuid4().hex[:6]}", cls, call_timeout_s)
        self.resource_pool = resource_pool
        check_device_name(self.name, device_name, resource_pool.use_gpu)
        self._ids = itertools.count(_INIT_CALL + 1)
        worker = cloudpickle.dumps(ClassWithInitArgs(cls, *ray_cls_with_init.args, **ray_cls_with_init.kwargs))
        port = str(free_port())
        user_code = user_code_for_workers().to_env()  # the driver's modules and its own registrations
        world = str(resource_pool.world_size)
        envs = [{"RANK": str(rank), "WORLD_SIZE": world, "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": world,
                 "RAY_LOCAL_RANK": str(rank), "RAY_LOCAL_WORLD_SIZE": world, "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": port, "WG_PREFIX": self.name, "WG_BACKEND": "process", "RLVR_WORKER_GROUP": self.name,
                 **user_code} for rank in range(resource_pool.world_size)]
        user_env = with_worker_env(self.name, {}, envs[0], _class_env_vars(self.name, ray_cls_with_init), worker_env)
        try:
            for rank, env in enumerate(envs):
                self._workers.append(self._spawn(rank, worker, {**env, **user_env}, max_concurrency))
            inits = [child.calls[_INIT_CALL] for child in self._workers]
            self._wait(inits, list(range(len(inits))), "__init__", resource_pool.start_timeout_s)
        except Exception:
            self.shutdown()  # no half-started group keeps its processes
            raise
        self._bind_worker_methods(cls)

    def _spawn(self, rank: int, worker: bytes, env: dict[str, str], max_concurrency: int) -> _Child:
        """Start rank ``rank``'s process and send it the worker to construct (its reply is call 0)."""
        parent_end, child_end = socket.socketpair()
        process = subprocess.Popen([sys.executable, "-c", _CHILD_CODE, str(child_end.fileno())],
                                   pass_fds=(child_end.fileno(),), env={**os.environ, **env})
        child_end.close()
        child = _Child(process, Connection(parent_end.detach()))
        child.calls[_INIT_CALL] = _Call(rank, "__init__")
        child.conn.send_bytes(pickle.dumps((list(sys.path), worker, max_concurrency)))
        threading.Thread(target=self._receive, args=(child,), daemon=True, name=f"{self.name}_rank{rank}_replies").start()
        return child

    def _receive(self, child: _Child) -> None:
        """Resolve the child's calls as its replies arrive; when its pipe closes, fail the rest."""
        while True:
            try:
                call_id, ok, value = pickle.loads(child.conn.recv_bytes())
            except (EOFError, OSError):
                break
            with child.calls_lock:
                call = child.calls.pop(call_id)
            call.ok, call.value = ok, value
            call.done.set()
        try:
            code = child.process.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            code = None
        reason = child.exit_reason or (f"the worker process died (exit code {code}"
                                       + (f", signal {signal.Signals(-code).name})" if code is not None and code < 0
                                          else ")"))
        with child.calls_lock:
            running = sorted({call.method for call in child.calls.values()})
            if running:  # several calls may be in flight: each names all of them, whichever is awaited first
                reason += f" while it ran {', '.join(running)}"
            for call in child.calls.values():
                call.died = reason
                call.done.set()
            child.calls.clear()
            child.gone = reason
        child.gone_event.set()

    def _submit(self, rank: int, method: str, args: tuple, kwargs: dict) -> _Call:
        child = self._workers[rank]
        call_id, call = next(self._ids), _Call(rank, method)
        data = cloudpickle.dumps((call_id, method, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
        with child.calls_lock:
            gone = child.gone
            if gone is None:
                child.calls[call_id] = call
        if gone is not None:  # a call after the process ended: the same reason, nothing sent
            call.died = f"{gone}; the call was not sent"
            call.done.set()
            return call
        try:
            with child.send_lock:
                child.conn.send_bytes(data)
        except OSError as err:  # the process ended meanwhile: say how (its receiver learns it) and what it ran
            with child.calls_lock:
                child.calls.pop(call_id, None)
            child.gone_event.wait(timeout=_GONE_WAIT_S)
            call.died = f"{child.gone or 'the worker process is gone'}; the call could not be sent ({err})"
            call.done.set()
        return call

    def _wait(self, handles: list, ranks: list[int], method: str, timeout_s: float) -> list:
        deadline = time.monotonic() + timeout_s
        outputs = []
        for call, rank in zip(handles, ranks):
            if not call.done.wait(max(deadline - time.monotonic(), 0.0)):
                late = [r for c, r in zip(handles, ranks) if not c.done.is_set()]
                raise self._fail(WorkerTimeoutError(
                    self.name, method, rank, f"no result from rank(s) {late} within {timeout_s:.1f} s (set "
                    "call_timeout_s or _timeout_s=... on the call to allow longer)"))
            if call.died is not None:
                raise self._fail(WorkerDiedError(self.name, method, rank, call.died))
            if not call.ok:
                raise WorkerError(self.name, method, rank, call.value)
            outputs.append(call.value)
        return outputs

    def shutdown(self) -> None:
        """Close the pipes and kill the children (hung ones too)."""
        for child in self._workers:
            child.exit_reason = "the group was shut down"
            child.conn.close()
            child.process.kill()
            child.process.wait(timeout=10.0)
        self._fail(WorkerError(self.name, "shutdown", 0, "the group was shut down"))


def child_main(fd: int) -> None:
    """A worker process: take the driver's ``sys.path`` and the worker over the socket ``fd``,
    construct the worker, then serve calls until the driver closes the socket."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle; it shuts the group down
    conn = Connection(fd)
    path, payload, max_concurrency = pickle.loads(conn.recv_bytes())
    sys.path[:] = path
    send_lock = threading.Lock()

    def reply(call_id: int, ok: bool, value: Any) -> None:
        try:
            data = cloudpickle.dumps((call_id, ok, value), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as err:  # noqa: BLE001 - an unpicklable result is the call's error
            data = pickle.dumps((call_id, False, f"the result could not be sent to the driver: {err!r}"))
        with send_lock:
            conn.send_bytes(data)

    try:
        worker = pickle.loads(payload)()
    except BaseException:  # noqa: BLE001 - reported to the driver, which raises it as the start failure
        reply(_INIT_CALL, False, traceback.format_exc())
        return
    reply(_INIT_CALL, True, None)

    def run(call_id: int, method: str, args: tuple, kwargs: dict) -> None:
        try:
            result = getattr(worker, method)(*args, **kwargs)
        except BaseException:  # noqa: BLE001 - every failure goes back to the driver with its traceback
            reply(call_id, False, traceback.format_exc())
            return
        reply(call_id, True, result)

    with ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="call") as pool:
        while True:
            try:
                call_id, method, args, kwargs = pickle.loads(conn.recv_bytes())
            except (EOFError, OSError):
                break
            pool.submit(run, call_id, method, args, kwargs)
        os._exit(0)  # the driver is gone or shut the group down: calls still running are abandoned
