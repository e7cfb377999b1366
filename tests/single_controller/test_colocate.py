"""Two roles fused into one process per device, and per-role groups from ``spawn``."""

from __future__ import annotations

import pytest
import torch
from sc_workers import BACKENDS, DemoWorker, OtherRoleWorker, world_size_of

from rlvr.protocol import DataProto
from rlvr.single_controller import ClassWithInitArgs, create_colocated_worker_cls


@pytest.mark.slow_on("process")
@pytest.mark.parametrize("backend", BACKENDS)
def test_colocated_roles_share_a_process_and_spawn_per_role_groups(backend, make_group):
    fused = create_colocated_worker_cls(
        {"actor": ClassWithInitArgs(DemoWorker, scale=3.0), "critic": ClassWithInitArgs(OtherRoleWorker, offset=100)}
    )
    group = make_group(backend, fused, name_prefix=f"fused_{backend}", call_timeout_s=60)
    n = world_size_of(backend)
    actor_info, critic_info = group.actor_info(), group.critic_info()
    assert [i["pid"] for i in actor_info] == [i["pid"] for i in critic_info]  # same process per rank
    assert len({i["pid"] for i in actor_info}) == n
    assert [i["offset"] for i in critic_info] == [100] * n

    roles = group.spawn(["actor", "critic"])
    actor, critic = roles["actor"], roles["critic"]
    assert actor.world_size == critic.world_size == n
    data = DataProto.from_dict(tensors={"x": torch.arange(3, dtype=torch.float32)})
    torch.testing.assert_close(actor.double(data).batch["y"], torch.tensor([0.0, 6.0, 12.0]))  # 2 * 3.0 * x
    torch.testing.assert_close(critic.double(data).batch["y"], torch.tensor([100.0, 102.0, 104.0]))  # 2x + 100
    assert actor.add_rank(1) == [1, 2][:n]
    assert not hasattr(critic, "add_rank")  # each role group has its own methods only
    # DP_MP dispatch reads the actor role's rank_info inside the fused process
    assert actor.mp_double(data).batch["rank"].tolist() == ([0, 0, 1] if n == 2 else [0, 0, 0])
    with pytest.raises(KeyError, match="no role 'reward'"):
        group.spawn(["reward"])
