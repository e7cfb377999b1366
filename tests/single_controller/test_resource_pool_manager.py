"""``ResourcePoolManager`` checks the cluster before anything starts and says what is missing."""

from __future__ import annotations

import pytest

from rlvr.trainer.ppo.resource_pool import ResourcePoolManager
from rlvr.trainer.ppo.utils import Role
from rlvr.utils.errors import ConfigError


@pytest.mark.ray
def test_gpu_pool_on_a_cpu_cluster_says_what_is_missing(ray_cluster):
    manager = ResourcePoolManager({"global_pool": [2]}, {Role.ActorRollout: "global_pool"})
    with pytest.raises(ConfigError) as info:
        manager.create_resource_pool()
    message = str(info.value)
    assert info.value.key == "trainer.n_gpus_per_node"
    assert "resource pool 'global_pool' asks for 2 GPUs on 1 node(s)" in message
    assert "the Ray cluster has 0 GPUs" in message and "trainer.n_gpus_per_node=0" in message
    assert manager.resource_pool_dict == {}


@pytest.mark.ray
def test_cpu_pools_are_created_and_mapped(ray_cluster):
    manager = ResourcePoolManager(
        {"global_pool": [2], "reward_pool": [1]},
        {Role.ActorRollout: "global_pool", Role.Critic: "global_pool", Role.RewardModel: "reward_pool"},
        use_gpu=False,
    )
    manager.create_resource_pool()
    assert manager.get_resource_pool(Role.Critic) is manager.get_resource_pool(Role.ActorRollout)
    assert manager.get_resource_pool(Role.ActorRollout).world_size == 2
    assert manager.get_resource_pool(Role.RewardModel).world_size == 1
    assert manager.get_n_gpus() == 3
    with pytest.raises(KeyError, match="role RefPolicy has no resource pool"):
        manager.get_resource_pool(Role.RefPolicy)
    with pytest.raises(ConfigError, match="asks for 3 nodes but the Ray cluster has 1"):
        ResourcePoolManager({"p": [1, 1, 1]}, {Role.Actor: "p"}, use_gpu=False).create_resource_pool()


def test_mapping_to_an_undefined_pool_is_a_config_error():
    with pytest.raises(ConfigError, match="role Critic is mapped to pool 'critic_pool', which is not defined"):
        ResourcePoolManager({"global_pool": [1]}, {Role.Critic: "critic_pool"})


def test_local_backend_allows_one_process_only():
    manager = ResourcePoolManager({"g": [1]}, {Role.ActorRollout: "g"}, use_gpu=False, backend="local")
    manager.create_resource_pool()
    assert manager.get_resource_pool(Role.ActorRollout).world_size == 1
    too_big = ResourcePoolManager({"p": [2]}, {Role.Actor: "p"}, use_gpu=False, backend="local")
    with pytest.raises(ConfigError, match="the local backend runs one worker in the driver"):
        too_big.create_resource_pool()
    with pytest.raises(ConfigError, match="unknown backend 'slurm'; choose one of local, ray"):
        ResourcePoolManager({"g": [1]}, {Role.Actor: "g"}, use_gpu=False, backend="slurm")
