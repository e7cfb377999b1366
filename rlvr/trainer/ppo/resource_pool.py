"""``ResourcePoolManager``: named resource pools and which role runs in which pool.

Before anything starts it checks that the cluster has the devices the pools ask for and says
what is missing and which config value to change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from rlvr.single_controller import ResourcePool, get_resource_pool_cls
from rlvr.trainer.ppo.utils import Role
from rlvr.utils.errors import ConfigError


@dataclass
class ResourcePoolManager:
    """Resource pools by name and the role -> pool mapping.

    Example: ``ResourcePoolManager({"global_pool": [2]}, {Role.ActorRollout: "global_pool"})``.
    """

    resource_pool_spec: dict[str, list[int]] = field(
        metadata={"help": "pool name -> worker processes per node, e.g. {'global_pool': [8, 8]}"}
    )
    mapping: dict[Role, str] = field(metadata={"help": "role -> name of the pool it runs in"})
    use_gpu: bool = field(default=True, metadata={"help": "one GPU per worker process; False: CPU workers"})
    backend: str = field(default="ray", metadata={"help": "single-controller backend: 'ray' or 'local'"})
    pool_backends: dict[str, str] = field(
        default_factory=dict,
        metadata={"help": "pool name -> its backend when not `backend`, e.g. {'rollout_pool': 'process'}: the "
                          "local backend's rollout in a child process"},
    )
    pool_options: dict[str, dict[str, Any]] = field(
        default_factory=dict,
        metadata={"help": "pool name -> extra keyword arguments of its pool class, e.g. {'rollout_pool': "
                          "{'resources': {'rollout_node': 0.01}}} to put it on labelled Ray nodes"},
    )
    resource_pool_dict: dict[str, ResourcePool] = field(
        default_factory=dict, metadata={"help": "the created pools (filled by create_resource_pool)"}
    )

    def __post_init__(self) -> None:
        for name in [None, *self.pool_backends]:
            get_resource_pool_cls(self.backend_of(name))  # an unknown backend is a ConfigError here
        for role, pool in self.mapping.items():
            if pool not in self.resource_pool_spec:
                raise ConfigError(
                    "resource_pool_spec",
                    f"role {role.name} is mapped to pool {pool!r}, which is not defined; "
                    f"pools: {sorted(self.resource_pool_spec)}",
                )

    def create_resource_pool(self) -> None:
        """Check the cluster, then create one pool per entry of ``resource_pool_spec``."""
        self._check_resource_available()
        for name, process_on_nodes in self.resource_pool_spec.items():
            self.resource_pool_dict[name] = get_resource_pool_cls(self.backend_of(name))(
                process_on_nodes=process_on_nodes, use_gpu=self.use_gpu, max_colocate_count=1, name_prefix=name,
                **self.pool_options.get(name, {}))

    def backend_of(self, pool: str | None) -> str:
        """The backend of the pool named ``pool`` (None: the manager's own)."""
        return self.pool_backends.get(pool, self.backend) if pool is not None else self.backend

    def pool_name(self, role: Role) -> str:
        """The name of the pool that ``role`` runs in."""
        if role not in self.mapping:
            raise KeyError(f"role {role.name} has no resource pool; mapped roles: {[r.name for r in self.mapping]}")
        return self.mapping[role]

    def get_resource_pool(self, role: Role) -> ResourcePool:
        """The pool that ``role`` runs in (after ``create_resource_pool``)."""
        return self.resource_pool_dict[self.pool_name(role)]

    def get_n_gpus(self) -> int:
        """Number of devices over all pools (GPUs, or CPU worker processes when ``use_gpu`` is False)."""
        return sum(sum(nodes) for nodes in self.resource_pool_spec.values())

    def _check_resource_available(self) -> None:
        """Raise ``ConfigError`` naming the pool and what is missing if the cluster is too small."""
        if self.backend == "local":
            self._check_local()
            return
        import ray  # here: the local backend runs without Ray installed

        if not ray.is_initialized():
            raise RuntimeError("Ray is not running: call rlvr.single_controller.init_ray() before creating pools")
        nodes = [node["Resources"] for node in ray.nodes() if node["Alive"]]
        kind = "GPU" if self.use_gpu else "CPU"
        per_node = sorted((res.get(kind, 0.0) for res in nodes), reverse=True)
        total_asked = 0
        for name, process_on_nodes in self.resource_pool_spec.items():
            asked = sum(process_on_nodes)
            total_asked += asked
            if self.use_gpu and asked > sum(per_node):
                raise ConfigError(
                    "trainer.n_gpus_per_node",
                    f"resource pool {name!r} asks for {asked} GPUs on {len(process_on_nodes)} node(s) "
                    f"({process_on_nodes} per node) but the Ray cluster has {sum(per_node):g} GPUs: set "
                    "trainer.n_gpus_per_node=0 to run on CPU, lower trainer.n_gpus_per_node / trainer.nnodes, "
                    "or start Ray on machines with GPUs",
                )
            if len(process_on_nodes) > len(per_node):
                raise ConfigError(
                    "trainer.nnodes",
                    f"resource pool {name!r} asks for {len(process_on_nodes)} nodes but the Ray cluster has "
                    f"{len(per_node)}: lower trainer.nnodes or add nodes to the cluster",
                )
            if self.use_gpu:
                for need, have in zip(sorted(process_on_nodes, reverse=True), per_node):
                    if need > have:
                        raise ConfigError(
                            "trainer.n_gpus_per_node",
                            f"resource pool {name!r} needs a node with {need} GPUs but the nodes have "
                            f"{per_node} GPUs: lower trainer.n_gpus_per_node",
                        )
        if self.use_gpu and total_asked > sum(per_node):
            raise ConfigError(
                "resource_pool_spec",
                f"the resource pools ask for {total_asked} GPUs together but the Ray cluster has "
                f"{sum(per_node):g}: make the pools smaller or map roles to one shared pool",
            )

    def _check_local(self) -> None:
        for name, process_on_nodes in self.resource_pool_spec.items():
            if list(process_on_nodes) != [1]:
                raise ConfigError(
                    "trainer.backend",
                    f"the local backend runs one worker in the driver, but resource pool {name!r} asks for "
                    f"{process_on_nodes} processes per node: set trainer.nnodes=1 and trainer.n_gpus_per_node=1 "
                    "(or 0 for CPU), or use trainer.backend=ray",
                )
        if self.use_gpu and torch.cuda.device_count() == 0:
            raise ConfigError(
                "trainer.n_gpus_per_node",
                "the local backend is asked to use a GPU but this machine has none: set trainer.n_gpus_per_node=0",
            )
