"""How the actor's weights reach a rollout apart from it, and the push that runs in the background.

:class:`WeightPacker` picks the way per push: on Ray one ``ray.put`` (the object store, any node);
on the local backend, whose rollout is a child process on this machine, a CUDA IPC handle when the
weights are CUDA tensors on the rollout child's GPU (:mod:`rlvr.workers.rollout.cuda_ipc_weights`:
no host copy), else a shared-memory handle (:mod:`rlvr.workers.rollout.shared_weights`; CUDA weights
on another device are copied to the host first). It says once in the log which way is used.

:class:`BackgroundPush` sends the pushed weights to the rollout workers in a thread of its own, so
the trainer goes on (its next update) while the rollout loads them. A handle is only valid until
the next push writes the buffer again, so :meth:`BackgroundPush.wait` comes first in every next
push, and before anything that needs the rollout to hold these weights (a generation of the
rollouter thread, a validation, a checkpoint, the end of the run). Its deadline is
``async_training.weight_sync_timeout_s`` (the workers' own calls have it too).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from rlvr.utils.errors import WorkerTimeoutError
from rlvr.workers.rollout.cuda_ipc_weights import CudaIpcWeightsWriter
from rlvr.workers.rollout.shared_weights import SharedWeightsWriter

__all__ = ["WeightPacker", "BackgroundPush", "WAIT_MARGIN_S"]

logger = logging.getLogger(__name__)

WAIT_MARGIN_S = 5.0
"""Extra seconds a wait for a push gives its thread beyond ``weight_sync_timeout_s`` (the thread's
own worker call times out first and reports which worker)."""


class WeightPacker:
    """Turns the actor's weights into what an ``update_weights`` call carries (module docstring).

    Args:
        on_ray: the Ray backend (weights go through the object store).
        rollout_device: the local rollout child's device (``cuda:0``, ``cpu``); ignored on Ray.
        ipc_writer: the CUDA IPC writer (default :class:`CudaIpcWeightsWriter`; tests give one
            with stand-ins for the CUDA calls).
    """

    def __init__(self, on_ray: bool, rollout_device: str | torch.device = "cpu",
                 ipc_writer: CudaIpcWeightsWriter | None = None) -> None:
        self.on_ray = on_ray
        self.rollout_device = torch.device(rollout_device)
        self.shared = SharedWeightsWriter()
        self.ipc = ipc_writer or CudaIpcWeightsWriter()
        self.path: str | None = None

    @property
    def wants_device_weights(self) -> bool:
        """Whether the actor should hand its weights over on its device (no host copy): only for
        a rollout child on a GPU."""
        return not self.on_ray and self.rollout_device.type == "cuda"

    def pack(self, weights: Mapping[str, torch.Tensor]) -> Any:
        """What to send for ``weights``: an object ref, a CUDA IPC or shared-memory handle, or the
        weights themselves (shared memory too small)."""
        if self.on_ray:
            import ray

            self._say("ray object store", "one copy in the object store for every rollout worker")
            return ray.put(weights)
        devices = {t.device for t in weights.values()}
        if devices == {self._ipc_device()}:
            self._say("cuda ipc", f"the actor's weights on {self.rollout_device} are copied on the GPU and "
                      "the rollout process on the same GPU maps them (no host copy)")
            return self.ipc.pack(weights)
        if any(d.type != "cpu" for d in devices):
            self._say("shared memory (from the device)", f"the actor's weights on {sorted(map(str, devices))} are "
                      f"not on the rollout's {self.rollout_device}: they go through host shared memory")
            weights = {name: t.detach().to("cpu") for name, t in weights.items()}
        else:
            self._say("shared memory", "the actor's weights on the CPU go through one shared-memory segment")
        return self.shared.pack(weights)

    def _ipc_device(self) -> torch.device | None:
        """The one device from which weights go by CUDA IPC (``None`` without a GPU rollout)."""
        if self.rollout_device.type != "cuda":
            return None
        return torch.device("cuda", self.rollout_device.index or 0)

    def _say(self, path: str, why: str) -> None:
        if path != self.path:
            self.path = path
            logger.info("async weight push: %s (%s)", path, why)

    def close(self) -> None:
        """Release the shared-memory segment and the CUDA buffer."""
        self.shared.close()
        self.ipc.close()


class BackgroundPush:
    """One ``update_weights`` call of the rollout workers at a time, in a thread (module docstring).

    Args:
        timeout_s: ``weight_sync_timeout_s``, the deadline of each push.
        group_name: the rollout worker group's name, for messages.
    """

    def __init__(self, timeout_s: float, group_name: str) -> None:
        self.timeout_s = timeout_s
        self.group_name = group_name
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._version: int | None = None
        self._lock = threading.Lock()  # one waiter at a time (the trainer's and the rollouter's threads)
        self.last_confirm_s = 0.0
        """Seconds from the start of the last confirmed push until every rollout worker replied."""

    def start(self, send: Callable[[], None], version: int, started: float) -> None:
        """Run ``send`` (the blocking worker call) in the background; ``started`` is when the push
        began (``time.perf_counter()``), for ``last_confirm_s``. The previous push must be waited for."""
        if self._thread is not None or self._error is not None:
            raise RuntimeError("a weight push started before the previous one was waited for (its buffer would "
                               "be written while the rollout may read it)")
        self._error, self._version = None, version

        def run() -> None:
            try:
                send()
                self.last_confirm_s = time.perf_counter() - started
            except BaseException as err:  # noqa: BLE001 - raised by the next wait, in the trainer's thread
                self._error = err

        self._thread = threading.Thread(target=run, daemon=True, name=f"rlvr-weight-push-v{version}")
        self._thread.start()

    @property
    def in_flight(self) -> bool:
        return self._thread is not None

    def wait(self, stage: str) -> None:
        """Wait until the rollout workers confirmed the push in flight, if any. A failed push stays
        failed (every wait raises) until :meth:`discard`.

        Args:
            stage: what needs the push done (for the error message).

        Raises:
            WorkerTimeoutError: no reply within ``weight_sync_timeout_s`` (+ ``WAIT_MARGIN_S``).
            the push's own error (a worker's failure, its call's timeout naming the worker).
        """
        with self._lock:
            thread = self._thread
            if thread is not None:
                thread.join(self.timeout_s + WAIT_MARGIN_S)
                if thread.is_alive():
                    raise WorkerTimeoutError(
                        self.group_name, "update_weights", 0,
                        f"the weight push of version {self._version} was not confirmed within "
                        f"{self.timeout_s + WAIT_MARGIN_S:.1f} s (async_training.weight_sync_timeout_s = "
                        f"{self.timeout_s:g} s) before {stage}")
                self._thread = None
            if self._error is not None:
                raise self._error

    def discard(self, timeout_s: float) -> bool:
        """Forget the push in flight and its failure (a new attempt of the trainer's loop, the end of
        the run): wait up to ``timeout_s`` for its thread. Returns whether no thread is left."""
        with self._lock:
            if self._thread is not None:
                self._thread.join(timeout_s)
                if self._thread.is_alive():
                    return False
                self._thread = None
            if self._error is not None:
                logger.info("a failed weight push of version %s was discarded: %s", self._version, self._error)
            self._error = None
            return True
