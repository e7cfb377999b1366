"""Model-parallel ranks of a Megatron worker on the local backend, as processes the driver starts.

The local backend runs one worker, inside the driver. A Megatron role that splits the model over
``n = tensor_model_parallel_size x pipeline_model_parallel_size > 1`` ranks makes the driver's
worker rank 0 and starts ranks ``1 ... n-1`` as processes (``python -m`` this module), all joined
in one ``torch.distributed`` group (gloo on CPU, NCCL on GPU: rank ``i`` uses GPU ``i``). Each
rank builds the same role worker; a worker method decorated with :func:`on_every_rank` is sent to
the other ranks with its arguments before rank 0 runs it, so the collectives inside meet. Only rank
0 serves the driver: it alone holds the rollout engine and returns results; the other ranks reply
"done" or their traceback. A breakpoint in rank 0's code works as with any local worker.

One set of ranks serves every Megatron role of the driver process (actor, reference and critic
share megatron's process-global layout). It starts with the first such worker, outlives trainers
that reuse the same size, is stopped and replaced when a new size is asked for after every worker
of the old one is gone, and is stopped at exit. A rank that fails or does not answer within the
call timeout raises :class:`~rlvr.utils.errors.WorkerError` naming it; the ranks are then stopped
(the others may wait in a collective), and later calls fail at once.
"""

from __future__ import annotations

import atexit
import functools
import os
import pickle
import secrets
import subprocess
import sys
import threading
import time
import traceback
import uuid
import weakref
from collections.abc import Callable
from datetime import timedelta
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

import torch
import torch.distributed as dist

from rlvr.single_controller.base.worker import free_port
from rlvr.utils.errors import WorkerError, WorkerTimeoutError

__all__ = ["LocalRanks", "attach_local_ranks", "helper_rank", "on_every_rank", "shutdown_local_ranks"]

_HELPER_RANK: int | None = None
_GROUP = "megatron local ranks"
_GRACE_S = 10.0
_AUTHKEY_ENV = "RLVR_MEGATRON_RANKS_AUTHKEY"


def helper_rank() -> int | None:
    """This process's rank when it is one of the started ranks, else None (the driver, a Ray worker)."""
    return _HELPER_RANK


def _put(conn: Connection, obj: Any) -> None:
    """Send with plain pickle: ``Connection.send`` uses torch's pickler, which passes tensors as
    shared-memory file descriptors that only a child of ``multiprocessing`` can open."""
    conn.send_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def _get(conn: Connection) -> Any:
    return pickle.loads(conn.recv_bytes())


def _serve(rank: int, world: int, port: int, conn, timeout_s: float, use_gpu: bool, parent: int) -> None:
    """Main loop of a started rank: join the group, then run the driver's messages until ``exit``."""
    global _HELPER_RANK
    _HELPER_RANK = rank
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(free_port()))
    if use_gpu:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if use_gpu else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=timeout_s))
    _put(conn, ("ok", None))
    workers: dict[str, Any] = {}
    while True:
        if not conn.poll(1.0):
            if os.getppid() != parent:  # the driver is gone
                return
            continue
        try:
            kind, key, payload = _get(conn)
        except EOFError:
            return
        if kind == "exit":
            return
        try:
            if kind == "add":
                cls, args, kwargs = payload
                workers[key] = cls(*args, **kwargs)
            elif kind == "remove":
                workers.pop(key, None)
            else:
                method, args, kwargs = payload
                getattr(workers[key], method)(*args, **kwargs)
            _put(conn, ("ok", None))
        except BaseException:  # noqa: BLE001 - reported to the driver, which raises it
            _put(conn, ("error", traceback.format_exc()))


def _accept(listener: Listener, procs: list[subprocess.Popen], timeout_s: float) -> list[Connection]:
    """The connections of the started ranks, ordered by rank (each sends its rank first)."""
    found: dict[int, Connection] = {}
    box: dict[str, BaseException] = {}

    def accept_all() -> None:
        try:
            while len(found) < len(procs):
                conn = listener.accept()
                found[_get(conn)] = conn
        except BaseException as err:  # noqa: BLE001 - re-raised by the caller
            box["error"] = err

    thread = threading.Thread(target=accept_all, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while thread.is_alive() and time.monotonic() < deadline:
        thread.join(0.5)
        dead = [rank for rank, proc in enumerate(procs, start=1) if proc.poll() is not None]
        if dead:
            raise WorkerError(_GROUP, "start", dead[0], f"the process exited with code {procs[dead[0] - 1].returncode}")
    if thread.is_alive() or "error" in box:
        raise WorkerTimeoutError(_GROUP, "start", 0, f"the ranks did not connect within {timeout_s:.0f} s: {box}")
    return [found[rank] for rank in range(1, len(procs) + 1)]


class LocalRanks:
    """Ranks ``1 ... world-1`` of the driver's Megatron workers (rank 0 is the driver itself).

    Args:
        world: ranks in all (``tp x pp``).
        timeout_s: limit of the start, of every call and of every collective.
        use_gpu: NCCL with one GPU per rank instead of gloo.
    """

    def __init__(self, world: int, timeout_s: float, use_gpu: bool) -> None:
        self.world, self.timeout_s = world, timeout_s
        self.workers: set[str] = set()
        self.broken: str | None = None
        self.conns: list[Connection] = []
        self.procs: list[subprocess.Popen] = []
        if world == 1:
            self._join_group(world, free_port(), use_gpu)
            return
        authkey = secrets.token_bytes(16)
        listener = Listener(("127.0.0.1", 0), authkey=authkey)
        port = free_port()
        env = {**os.environ, _AUTHKEY_ENV: authkey.hex()}
        for rank in range(1, world):
            argv = [sys.executable, "-m", __name__, *map(str, (*listener.address, rank, world, port, timeout_s,
                                                                 int(use_gpu), os.getpid()))]
            self.procs.append(subprocess.Popen(argv, env=env))
        try:
            self.conns = _accept(listener, self.procs, timeout_s)
        except WorkerError:
            self.close()
            raise
        finally:
            listener.close()
        self._join_group(world, port, use_gpu)
        self._collect("start", timeout_s)

    def _join_group(self, world: int, port: int, use_gpu: bool) -> None:
        dist.init_process_group("nccl" if use_gpu else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                                world_size=world, timeout=timedelta(seconds=self.timeout_s))

    def _fail(self, method: str, rank: int, detail: str, timeout: bool = False) -> WorkerError:
        self.close()
        self.broken = f"rank {rank} failed in {method}()"
        return (WorkerTimeoutError if timeout else WorkerError)(_GROUP, method, rank, detail)

    def _collect(self, method: str, timeout_s: float) -> None:
        """Every rank's reply to the last message; on failures raises the root cause (a dead
        process before an error, an error before a timeout) naming its rank."""
        failures: list[tuple[int, int, str]] = []  # (priority, rank, detail)
        deadline = time.monotonic() + timeout_s
        for rank, conn in enumerate(self.conns, start=1):
            proc = self.procs[rank - 1]
            while not conn.poll(0.5):
                if proc.poll() is not None or time.monotonic() > deadline:
                    break
            if conn.poll(0):
                status, detail = _get(conn)
                if status == "error":
                    failures.append((1, rank, detail))
            elif proc.poll() is not None:
                failures.append((0, rank, f"the process died with exit code {proc.returncode} (a negative code is "
                                          "the signal that ended it: -9 is SIGKILL, e.g. from the out-of-memory killer)"))
            else:
                failures.append((2, rank, f"no reply within {timeout_s:.0f} s"))
        if failures:
            priority, rank, detail = min(failures)
            raise self._fail(method, rank, detail, timeout=priority == 2)

    def _send(self, kind: str, key: str, payload: Any) -> None:
        if self.broken:
            raise WorkerError(_GROUP, kind, 0, f"the local model-parallel ranks were stopped: {self.broken}")
        for conn in self.conns:
            _put(conn, (kind, key, payload))

    def add(self, key: str, cls: type, args: tuple, kwargs: dict) -> None:
        """Build ``cls(*args, **kwargs)`` under ``key`` on every started rank."""
        self._send("add", key, (cls, args, kwargs))
        self._collect(f"{cls.__name__}.__init__", self.timeout_s)
        self.workers.add(key)

    def remove(self, key: str) -> None:
        """Drop the workers under ``key`` (nothing when the ranks are stopped)."""
        self.workers.discard(key)
        if not self.broken and self.procs:
            self._send("remove", key, None)
            self._collect("remove", self.timeout_s)

    def run(self, key: str, method: str, args: tuple, kwargs: dict, local: Callable[[], Any]) -> Any:
        """Run ``method`` on the started ranks' workers ``key`` and ``local()`` here; returns ``local()``'s result."""
        self._send("call", key, (method, args, kwargs))
        try:
            out = local()
        except BaseException as err:
            try:
                self._collect(method, _GRACE_S)
            except WorkerError as others:  # what the other ranks saw, attached to rank 0's own error
                raise err from others
            raise
        self._collect(method, self.timeout_s)
        return out

    def close(self) -> None:
        """Stop the started ranks and leave the process group."""
        for conn in self.conns:
            try:
                _put(conn, ("exit", "", None))
            except (BrokenPipeError, OSError):
                pass
        for proc in self.procs:
            try:
                proc.wait(_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.conns, self.procs = [], []
        if dist.is_initialized():
            from megatron.core import parallel_state

            parallel_state.destroy_model_parallel()
            dist.destroy_process_group()


_RANKS: LocalRanks | None = None


def shutdown_local_ranks() -> None:
    """Stop the started ranks of this process (at exit, or to start over with another size)."""
    global _RANKS
    if _RANKS is not None:
        _RANKS.close()
        _RANKS = None


atexit.register(shutdown_local_ranks)


def _local_ranks(world: int, timeout_s: float, use_gpu: bool) -> LocalRanks:
    global _RANKS
    if _RANKS is not None and (_RANKS.world != world or _RANKS.broken):
        if _RANKS.workers and not _RANKS.broken:
            raise RuntimeError(
                f"this process already runs Megatron workers over {_RANKS.world} local ranks; every Megatron "
                f"role of a run must use the same tensor x pipeline parallel size (asked for {world})")
        shutdown_local_ranks()
    if _RANKS is None:
        if dist.is_initialized():
            raise RuntimeError("the local backend's Megatron ranks need a fresh process: torch.distributed is "
                               "already initialised in the driver")
        _RANKS = LocalRanks(world, timeout_s, use_gpu)
    return _RANKS


def attach_local_ranks(worker: Any, world: int, init_args: tuple, timeout_s: float) -> tuple[LocalRanks | None, str]:
    """For a worker of the local backend (a group of one in the driver): the process group of its
    ``world`` model-parallel ranks (started here, none when ``world == 1``), with a copy of the worker
    built on each started rank from ``init_args``; ``(None, "")`` for a worker of a Ray group or a
    started rank. The copies are dropped when ``worker`` is garbage-collected.
    """
    if worker.world_size > 1 or helper_rank() is not None:
        return None, ""
    ranks = _local_ranks(world, timeout_s, worker.device.startswith("cuda"))
    key = uuid.uuid4().hex
    ranks.add(key, type(worker), init_args, {})
    weakref.finalize(worker, ranks.remove, key)
    return ranks, key


def on_every_rank(method: Callable) -> Callable:
    """Decorate a worker method so that, on the local backend, the started ranks run it too (with
    the same arguments, before rank 0 does); elsewhere the method runs as it is."""

    @functools.wraps(method)
    def run(self, *args: Any, **kwargs: Any) -> Any:
        if self._local_ranks is None:
            return method(self, *args, **kwargs)
        return self._local_ranks.run(self._local_key, method.__name__, args, kwargs,
                                     lambda: method(self, *args, **kwargs))

    return run


def _main(argv: list[str]) -> None:
    """A started rank: ``python -m rlvr.workers.megatron.local_ranks HOST PORT RANK WORLD GROUP_PORT
    TIMEOUT_S USE_GPU PARENT_PID`` (the driver's :class:`LocalRanks` runs it)."""
    host, port, rank, world, group_port, timeout_s, use_gpu, parent = argv
    conn = Client((host, int(port)), authkey=bytes.fromhex(os.environ.pop(_AUTHKEY_ENV)))
    _put(conn, int(rank))
    _serve(int(rank), int(world), int(group_port), conn, float(timeout_s), bool(int(use_gpu)), int(parent))


if __name__ == "__main__":
    # run from the imported module, not from __main__: the workers read its state (helper_rank)
    from rlvr.workers.megatron import local_ranks

    local_ranks._main(sys.argv[1:])
