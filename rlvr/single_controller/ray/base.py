"""Ray backend: one Ray actor per device, placed with placement groups.

``RayResourcePool`` reserves one bundle per worker process (a GPU plus a CPU share, or a CPU share
only); ``RayWorkerGroup`` starts one actor of the worker class in each bundle, gives it its rank
and the user's code the driver imported through the environment, and inherits dispatch / execute /
collect from ``WorkerGroup``. Every wait
goes through ``ray.wait`` with a timeout, so a hung or dead worker raises instead of blocking.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Sequence
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError
from ray.util.placement_group import (
    PlacementGroup,
    placement_group,
    placement_group_table,
    remove_placement_group,
)
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rlvr.single_controller.base.colocate import create_colocated_worker_cls, create_colocated_worker_raw_cls
from rlvr.single_controller.base.worker import free_port, node_ip
from rlvr.single_controller.base.worker_group import (
    ClassWithInitArgs,
    ResourcePool,
    WorkerGroup,
    check_device_name,
    with_worker_env,
)
from rlvr.utils.errors import WorkerDiedError, WorkerError, WorkerTimeoutError
from rlvr.utils.registrations import user_code_for_workers

__all__ = [
    "RayClassWithInitArgs",
    "RayResourcePool",
    "RayWorkerGroup",
    "create_colocated_worker_cls",
    "create_colocated_worker_cls_fused",
    "create_colocated_worker_raw_cls",
    "init_ray",
]

RayClassWithInitArgs = ClassWithInitArgs
# verl's name for the fused-worker variant; rlvr has one fused class that serves spawn()
create_colocated_worker_cls_fused = create_colocated_worker_cls

WORKER_ENV_VARS = {"TOKENIZERS_PARALLELISM": "false", "NCCL_DEBUG": "WARN"}
PEER_DEATH_GRACE_S = 5.0
"""After a rank raises, how long to look for another rank of the same call that died (the cause)."""


def init_ray(
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    address: str | None = None,
    object_store_memory: int = 512 * 1024**2,
    env_vars: dict[str, str] | None = None,
) -> None:
    """Start (or join) Ray once per driver process with settings that suit a small machine.

    Args:
        num_cpus: CPUs of a new local cluster (default: all of this machine).
        num_gpus: GPUs of a new local cluster (default: all visible).
        address: cluster to join; default ``RAY_ADDRESS`` if set, else a new local cluster
            (never someone else's cluster on the same machine).
        object_store_memory: bytes of shared memory for a new local cluster's object store.
        env_vars: extra environment variables for every worker (added to ``WORKER_ENV_VARS``).
    """
    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS") or "local"
    runtime_env = {"env_vars": {**WORKER_ENV_VARS, **(env_vars or {})}}
    if address == "local":
        ray.init(
            address="local",
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            object_store_memory=object_store_memory,
            include_dashboard=False,
            log_to_driver=True,
            runtime_env=runtime_env,
        )
    else:
        ray.init(address=address, log_to_driver=True, runtime_env=runtime_env)


class RayResourcePool(ResourcePool):
    """Placement groups (one per node) with one bundle per worker process.

    The positional order is verl's: ``RayResourcePool([2], False, "pool")``.

    Args:
        process_on_nodes: worker processes on each node, e.g. ``[2]``.
        use_gpu: each bundle holds one GPU; else bundles are CPU-only.
        name_prefix: prefix of the placement-group names.
        max_colocate_count: worker groups that may share a bundle; each worker takes a
            ``1 / max_colocate_count`` share of its bundle (verl's default, 10).
        detached: the placement groups outlive the driver (``lifetime="detached"``).
        accelerator_type: a Ray accelerator resource each GPU bundle asks for (e.g. ``"A100"``).
        num_cpus_per_bundle: CPUs reserved per bundle; a small share lets 2 workers fit on 2 cores.
        start_timeout_s: how long to wait for the placement groups to be scheduled and for the
            workers of a group to be constructed.
        resources: custom Ray resources each bundle asks for, e.g. ``{"rollout_node": 0.01}`` to put
            the pool on the nodes started with that resource (``ray start --resources``).
    """

    def __init__(
        self,
        process_on_nodes: Sequence[int],
        use_gpu: bool = True,
        name_prefix: str | None = None,
        max_colocate_count: int = 10,
        detached: bool = False,
        accelerator_type: str | None = None,
        *,
        num_cpus_per_bundle: float = 0.1,
        start_timeout_s: float = 600.0,
        resources: dict[str, float] | None = None,
    ) -> None:
        super().__init__(process_on_nodes, max_colocate_count)
        self.use_gpu = use_gpu
        self.name_prefix = name_prefix or f"pool_{uuid.uuid4().hex[:6]}"
        self.detached = detached
        self.accelerator_type = accelerator_type
        self.num_cpus_per_bundle = num_cpus_per_bundle
        self.start_timeout_s = start_timeout_s
        self.resources = dict(resources or {})
        self._pgs: list[PlacementGroup] | None = None

    def bundle(self) -> dict[str, float]:
        """Resources of one bundle."""
        bundle = {"CPU": self.num_cpus_per_bundle, **self.resources}
        if self.use_gpu:
            bundle["GPU"] = 1.0
            if self.accelerator_type is not None:
                bundle[self.accelerator_type] = 1e-4
        return bundle

    def get_placement_groups(self, strategy: str = "STRICT_PACK") -> list[PlacementGroup]:
        """The pool's placement groups, created (and waited for) on first use with ``strategy``
        (``STRICT_PACK``: each node's bundles on one node; ``PACK``: best effort)."""
        if self._pgs is None:
            lifetime = "detached" if self.detached else None
            pgs = [
                placement_group(
                    [self.bundle()] * n, strategy=strategy, name=f"{self.name_prefix}_pg{i}", lifetime=lifetime
                )
                for i, n in enumerate(self.store)
            ]
            ready, _ = ray.wait([pg.ready() for pg in pgs], num_returns=len(pgs), timeout=self.start_timeout_s)
            if len(ready) < len(pgs):
                for pg in pgs:
                    remove_placement_group(pg)
                raise RuntimeError(
                    f"resource pool '{self.name_prefix}': placement groups for {self.store} processes per node "
                    f"(bundle {self.bundle()}) not scheduled after {self.start_timeout_s:.0f} s; the cluster has "
                    f"{ray.available_resources()} available. Free resources or ask for fewer processes."
                )
            self._pgs = pgs
        return self._pgs

    def remove(self) -> None:
        """Give the placement groups back to the cluster."""
        for pg in self._pgs or []:
            remove_placement_group(pg)
        self._pgs = None


def _master_env_on_driver_node(pg: PlacementGroup) -> dict[str, str]:
    """Rendezvous address for rank 0 when its bundle is on the driver's node, else ``{}``."""
    if placement_group_table(pg)["bundles_to_node_id"][0] != ray.get_runtime_context().get_node_id():
        return {}
    return {"MASTER_ADDR": node_ip(), "MASTER_PORT": str(free_port())}


class RayWorkerGroup(WorkerGroup):
    """A group of Ray actors of one worker class, one per bundle of ``resource_pool``.

    The positional order is verl's; rlvr's own settings are keyword-only.

    Args:
        resource_pool: where the actors go (a ``RayResourcePool``).
        ray_cls_with_init: the worker class (plain or wrapped with ``ray.remote``) and its
            constructor arguments.
        bin_pack: place each node's workers on one node (``STRICT_PACK``), else best effort
            (``PACK``); applies when the pool creates its placement groups.
        name_prefix: group name used in actor names and error messages (default: class name + id).
        detached: actors outlive the driver (named, ``lifetime="detached"``).
        call_timeout_s: timeout of every call; default ``RLVR_CALL_TIMEOUT_S`` / 3600 s (start-up
            waits ``resource_pool.start_timeout_s``).
        device_name: the accelerator of GPU bundles, ``"cuda"`` (verl's default); ``"cpu"`` is
            accepted for CPU-only pools.
        max_concurrency: calls each actor runs at once, in threads (Ray's threaded actors): a rollout
            worker takes new weights while it generates. 1 (default): one call at a time.
        worker_env: extra environment variables of every worker (verl's ``worker_env``); they are
            merged with the ``env_vars`` of the worker class's ``ray.remote(runtime_env=...)``, and
            one that the group sets itself (``RANK``, ``WORLD_SIZE``, ``MASTER_PORT``, ... see
            :mod:`rlvr.single_controller.base.worker`) raises ``ValueError`` before any worker starts.
    """

    def __init__(
        self,
        resource_pool: RayResourcePool,
        ray_cls_with_init: ClassWithInitArgs,
        bin_pack: bool = True,
        name_prefix: str | None = None,
        detached: bool = False,
        *,
        call_timeout_s: float | None = None,
        device_name: str = "cuda",
        max_concurrency: int = 1,
        worker_env: dict[str, str] | None = None,
    ) -> None:
        cls = ray_cls_with_init.cls
        super().__init__(name_prefix or f"{cls.__name__}_{uuid.uuid4().hex[:6]}", cls, call_timeout_s)
        self.resource_pool = resource_pool
        check_device_name(self.name, device_name, resource_pool.use_gpu)
        self.max_concurrency = max_concurrency
        try:
            self._start_workers(ray_cls_with_init, bin_pack, detached, worker_env)
            self._query_rank_infos("__init__", resource_pool.start_timeout_s)  # every worker constructed
        except Exception:
            self.shutdown()  # no half-started group keeps its actors
            raise
        self._bind_worker_methods(cls)

    def _start_workers(self, ray_cls_with_init: ClassWithInitArgs, bin_pack: bool, detached: bool,
                       worker_env: dict[str, str] | None) -> None:
        """One actor per bundle. ``MASTER_ADDR``/``MASTER_PORT`` come from rank 0: picked here when
        rank 0 lands on the driver's node (then all ranks start at once), else by rank 0 itself,
        which then starts alone first."""
        pool = self.resource_pool
        remote_cls = ray_cls_with_init.actor_cls or ray.remote(ray_cls_with_init.cls)
        class_runtime_env = ray_cls_with_init.runtime_env  # options(runtime_env=...) would replace it: merged
        user_code = user_code_for_workers().to_env()  # the driver's modules and its own registrations
        protected = {*self._system_env(0, 0, 1, user_code), "MASTER_ADDR", "MASTER_PORT"}
        user_env = with_worker_env(self.name, {}, protected, class_runtime_env.get("env_vars"), worker_env)
        share = 1.0 / pool.max_colocate_count
        pgs = pool.get_placement_groups("STRICT_PACK" if bin_pack else "PACK")
        master = _master_env_on_driver_node(pgs[0])
        rank = 0
        for pg, n_local in zip(pgs, pool.store):
            for local_rank in range(n_local):
                env = {**self._system_env(rank, local_rank, n_local, user_code), **master, **user_env}
                actor = remote_cls.options(
                    scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=local_rank),
                    num_cpus=pool.num_cpus_per_bundle * share,
                    num_gpus=share if pool.use_gpu else 0,
                    runtime_env={**class_runtime_env, "env_vars": env},
                    name=f"{self.name}_rank{rank}",
                    lifetime="detached" if detached else None,
                    max_concurrency=self.max_concurrency,
                ).remote(*ray_cls_with_init.args, **ray_cls_with_init.kwargs)
                self._workers.append(actor)
                if not master:
                    ref = actor.get_master_address.remote()
                    addr, port = self._wait([ref], [0], "__init__", pool.start_timeout_s)[0]
                    master = {"MASTER_ADDR": addr, "MASTER_PORT": str(port)}
                rank += 1

    def _system_env(self, rank: int, local_rank: int, n_local: int, user_code: dict[str, str]) -> dict[str, str]:
        """The variables the group sets in worker ``rank`` (the ``local_rank``-th of ``n_local`` on its
        node), as verl sets them: a Ray actor sees only its own device, so ``LOCAL_RANK`` is 0 and
        ``LOCAL_WORLD_SIZE`` 1, and its place on the node is ``RAY_LOCAL_RANK`` / ``RAY_LOCAL_WORLD_SIZE``
        (``MASTER_ADDR`` / ``MASTER_PORT`` are added by :meth:`_start_workers`)."""
        return {
            "RANK": str(rank),
            "WORLD_SIZE": str(self.resource_pool.world_size),
            "RAY_LOCAL_RANK": str(local_rank),
            "RAY_LOCAL_WORLD_SIZE": str(n_local),
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
            "WG_PREFIX": self.name,
            "WG_BACKEND": "ray",
            "RLVR_WORKER_GROUP": self.name,
            **user_code,
        }

    def _submit(self, rank: int, method: str, args: tuple, kwargs: dict) -> ray.ObjectRef:
        return getattr(self._workers[rank], method).remote(*args, **kwargs)

    def _wait(self, handles: list, ranks: list[int], method: str, timeout_s: float) -> list:
        """Results in order. When a rank raises, its error is raised once the other ranks of the
        call have finished; as a :class:`WorkerDiedError` when one of them dies within
        ``PEER_DEATH_GRACE_S`` (the death is the cause), and as a :class:`WorkerTimeoutError` (the
        raise as its cause) when one of them is still running at the call's deadline: a rank that
        raised inside a collective leaves its peers hung, and both are failures a restart cures."""
        deadline = time.monotonic() + timeout_s
        position = {ref: i for i, ref in enumerate(handles)}
        outputs: list[Any] = [None] * len(handles)
        pending = list(handles)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=max(deadline - time.monotonic(), 0.0))
            if not ready:
                late = sorted(ranks[position[ref]] for ref in pending)
                raise self._fail(
                    WorkerTimeoutError(
                        self.name,
                        method,
                        late[0],
                        f"no result from rank(s) {late} within {timeout_s:.1f} s (set call_timeout_s, the "
                        "RLVR_CALL_TIMEOUT_S environment variable or _timeout_s=... on the call to allow longer)",
                    )
                )
            i = position[ready[0]]
            try:
                outputs[i] = self._get(ready[0], ranks[i], method)
            except WorkerDiedError:
                raise
            except WorkerError as err:
                died = self._peer_death(pending, ranks, position, method, deadline)
                if died is not None:
                    raise died from err
                stuck = self._stuck_peers(pending, ranks, position, deadline)
                if not stuck:
                    raise
                raise self._fail(WorkerTimeoutError(
                    self.name, method, stuck[0],
                    f"rank {ranks[i]} raised and rank(s) {stuck} gave no result within {timeout_s:.1f} s: the "
                    "group is stuck in the call (a rank that raised inside a collective leaves its peers "
                    "waiting); the raise is the cause below")) from err
        return outputs

    def _stuck_peers(self, pending: list, ranks: list[int], position: dict, deadline: float) -> list[int]:
        """The ranks of ``pending`` still running at ``deadline`` (after another rank of the call
        raised): those are hung, and the group cannot be used again; [] when they all finished."""
        if pending:
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=max(deadline - time.monotonic(), 0.0))
        return sorted(ranks[position[ref]] for ref in pending)

    def _peer_death(self, pending: list, ranks: list[int], position: dict, method: str,
                    deadline: float) -> WorkerDiedError | None:
        """A rank of ``pending`` that dies within ``PEER_DEATH_GRACE_S``, or None. When a rank dies in a
        collective, the other ranks fail too (the connection to it closed); the death is the cause."""
        grace_end = min(time.monotonic() + PEER_DEATH_GRACE_S, deadline)
        while pending and time.monotonic() < grace_end:
            ready, pending = ray.wait(pending, num_returns=1, timeout=max(grace_end - time.monotonic(), 0.0))
            for ref in ready:
                try:
                    ray.get(ref)
                except RayActorError as err:
                    return self._fail(WorkerDiedError(self.name, method, ranks[position[ref]],
                                                      f"the worker process died: {err}"))
                except RayTaskError:
                    continue
        return None

    def _get(self, ref: ray.ObjectRef, rank: int, method: str) -> Any:
        try:
            return ray.get(ref)
        except RayTaskError as err:
            raise WorkerError(self.name, method, rank, str(err)) from None
        except RayActorError as err:
            raise self._fail(WorkerDiedError(self.name, method, rank, f"the worker process died: {err}")) from None

    def shutdown(self) -> None:
        """Kill the group's actors (the resource pool keeps its placement groups)."""
        for actor in self._workers:
            ray.kill(actor, no_restart=True)
        self._fail(WorkerError(self.name, "shutdown", 0, "the group was shut down"))
