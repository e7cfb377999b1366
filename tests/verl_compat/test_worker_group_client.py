"""verl 0.9 client code for worker groups, with only the import renamed: ``@ray.remote`` worker
classes in ``RayClassWithInitArgs``, every ``Dispatch`` mode, non-blocking calls and their
futures, auto padding, colocation. On Ray (2 CPU workers) and on the local backend (1 worker).
"""

from __future__ import annotations

import pytest
import ray
import torch
import verl_workers
from verl_workers import AdderWorker, CriticLikeWorker

from rlvr import DataProto
from rlvr.protocol import DataProtoConfig, DataProtoFuture, auto_padding
from rlvr.single_controller.ray.base import (
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    create_colocated_worker_cls,
    create_colocated_worker_raw_cls,
)

BACKENDS = [pytest.param("ray", marks=[pytest.mark.ray, pytest.mark.slow]), "local"]


def ranks(backend: str) -> int:
    return 2 if backend == "ray" else 1


def batch(n: int) -> DataProto:
    """``a [n] = 0..n-1``."""
    return DataProto.from_dict(tensors={"a": torch.arange(n, dtype=torch.float32)})


@pytest.fixture(scope="module", params=BACKENDS)
def adder(request):
    """``(backend, group)`` of ``AdderWorker(x=2)``, shared by the tests of this module."""
    backend = request.param
    if backend == "ray":
        request.getfixturevalue("verl_ray_cluster")
        pool = RayResourcePool([2], use_gpu=False)
        group = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=RayClassWithInitArgs(cls=AdderWorker, x=2),
                               name_prefix="verl_adder", device_name="cpu")
    else:
        from rlvr.single_controller import LocalResourcePool, LocalWorkerGroup

        pool = LocalResourcePool([1])
        group = LocalWorkerGroup(pool, RayClassWithInitArgs(cls=AdderWorker, x=2), name_prefix="verl_adder_local")
    yield backend, group
    group.shutdown()
    pool.remove()


def test_every_dispatch_mode(adder):
    backend, group = adder
    n = ranks(backend)
    assert group.world_size == n
    assert group.one_to_all(3) == [5, 6][:n]  # x + y + rank
    assert group.all_to_all([1, 2][:n]) == [3, 4][:n]
    assert group.on_rank_zero(1, 2) == (5, 0)  # rank 0 gets the arguments unsplit
    assert group.dp_compute([3, 4][:n]) == [6, 8][:n]
    with pytest.raises(AssertionError):
        group.dp_compute([1, 2, 3])
    assert group.custom_dict([10, 20]) == [12, 22][:n]  # rank r gets item r % 2
    assert group.custom_registered([3, 4]) == (6 + 8 if n == 2 else 6)  # registered mode: sum of x * item
    assert group.execute_all_sync("foo", y=3) == [5] * n
    assert group.execute_all_sync("foo", [1, 2][:n]) == [3, 4][:n]
    assert group.execute_rank_zero_sync("foo", 4) == 6
    assert group.execute_func_rank_zero(verl_workers.plus_one, 41) == 42


@pytest.mark.parametrize("rows", [4, 5])
def test_dp_compute_proto_modes(adder, rows):
    backend, group = adder
    n = ranks(backend)
    data = batch(rows)
    out = group.add_x(data)
    assert out.batch["a"].tolist() == [i + 2.0 for i in range(rows)]
    per_rank = -(-rows // n)  # padded to a multiple of n, then cut in equal parts
    assert out.batch["rank"].tolist() == [i // per_rank for i in range(rows)]
    assert data.batch["a"].tolist() == list(map(float, range(rows)))  # the caller's batch is unchanged
    assert group.add_x(data=data).batch["a"].tolist() == out.batch["a"].tolist()  # as a keyword too
    squared = group.apply(lambda a: a * a, data)  # DP_COMPUTE_PROTO_WITH_FUNC
    assert squared.batch["a"].tolist() == [float(i * i) for i in range(rows)]
    doubled = group.execute_with_func_generator(verl_workers.doubled_a, data)
    assert doubled.batch["a"].tolist() == [2.0 * i for i in range(rows)]
    metrics = group.row_count(batch(4))  # DP_COMPUTE_METRIC: one output per rank
    assert metrics == ([{"rows": 2, "sum": 1.0}, {"rows": 2, "sum": 5.0}] if n == 2 else [{"rows": 4, "sum": 6.0}])


@pytest.mark.parametrize("adder", [pytest.param("ray", marks=[pytest.mark.ray, pytest.mark.slow])], indirect=True)
def test_auto_padding_switches(adder):  # on Ray only: one local worker divides every batch
    _, group = adder
    DataProtoConfig.dispatch_padding = False  # verl's rule: pad only with auto padding
    try:
        with pytest.raises(AssertionError):
            group.add_x(batch(5))
        padded = DataProto.from_dict(tensors={"a": torch.arange(5.0)}, auto_padding=True)
        assert group.add_x(padded).batch["a"].tolist() == [2.0, 3.0, 4.0, 5.0, 6.0]
        with auto_padding():
            assert len(group.add_x(batch(7))) == 7
        DataProtoConfig.auto_padding = True
        assert group.add_x(batch(3)).batch["rank"].tolist() == [0, 0, 1]
    finally:
        DataProtoConfig.auto_padding = False
        DataProtoConfig.dispatch_padding = True


def test_non_blocking_calls_and_futures(adder):
    backend, group = adder
    n = ranks(backend)
    future = group.one_to_all_async(1)
    assert future.get() == [3, 4][:n]
    refs = group.execute_all_async("foo", y=4)
    if backend == "ray":  # verl code passes the futures to ray.get
        assert ray.get(future) == [3, 4] and ray.get(refs) == [6, 6]
    assert refs.get() == [6] * n

    pending = group.add_x_async(batch(4))
    assert isinstance(pending, DataProtoFuture)
    assert pending.get().batch["a"].tolist() == [2.0, 3.0, 4.0, 5.0]
    assert [part.get().batch["a"].tolist() for part in pending.chunk(2)] == [[2.0, 3.0], [4.0, 5.0]]
    assert group.add_x(pending).batch["a"].tolist() == [4.0, 5.0, 6.0, 7.0]  # resolved before dispatch
    # materialize_futures=False: each worker gets its part of the future and resolves it itself
    if backend == "ray":
        parts = DataProtoFuture.concat([ray.put(batch(2)), ray.put(batch(2))])
        assert parts.get().batch["a"].tolist() == [0.0, 1.0, 0.0, 1.0]
        assert group.resolve_and_add_x(parts).batch["a"].tolist() == [2.0, 3.0, 2.0, 3.0]
    else:
        assert group.resolve_and_add_x(group.add_x_async(batch(2))).batch["a"].tolist() == [4.0, 5.0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_colocated_workers_match_separate_groups(backend, new_group):
    actor_cls = RayClassWithInitArgs(cls=AdderWorker, x=2)
    critic_cls = RayClassWithInitArgs(cls=CriticLikeWorker, config={"b": 10})
    critic = new_group(backend, critic_cls)
    data = batch(4)
    expected_critic = critic.sub(data)
    torch.testing.assert_close(expected_critic.batch["a"], torch.tensor([-10.0, -9.0, -8.0, -7.0]))

    raw = create_colocated_worker_raw_cls({"actor": actor_cls, "critic": critic_cls})
    assert raw.is_fused_worker and raw.__name__ == "FusedWorker_actor_critic"
    assert raw.raw_cls_dict == {"actor": AdderWorker.__ray_actor_class__, "critic": CriticLikeWorker}
    fused = new_group(backend, RayClassWithInitArgs(cls=ray.remote(raw)), pool=critic.resource_pool)
    roles = fused.spawn(prefix_set={"actor", "critic"})
    torch.testing.assert_close(roles["critic"].sub(data).batch, expected_critic.batch, atol=0, rtol=0)
    assert roles["actor"].add_x(data).batch["a"].tolist() == [2.0, 3.0, 4.0, 5.0]
    assert roles["actor"].one_to_all(0) == [2, 3][: ranks(backend)]
    assert isinstance(create_colocated_worker_cls({"actor": actor_cls}), RayClassWithInitArgs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fused_workers_with_a_subclass_that_calls_both_roles(backend, new_group):
    """verl's fused workers: a subclass of ``create_colocated_worker_raw_cls(...)`` adds a method
    that calls ``self.actor`` and ``self.critic`` in one process; ``group.fuse(roles)`` gives
    ``group.actor`` / ``group.critic``, and the fused method agrees with the two role calls."""
    hybrid = RayClassWithInitArgs(cls=verl_workers.HybridWorker)
    hybrid.fused_worker_used = True  # verl's flag; rlvr's fused class needs no flag
    group = new_group(backend, hybrid)
    group.fuse(verl_workers.FUSED_ROLES.keys())
    x = group.actor.add(0.1)
    y = group.critic.sub(x)
    z = group.foo(0.1)
    expected = [0.1 + rank - 10 for rank in range(ranks(backend))]
    assert x == [0.1 + rank for rank in range(ranks(backend))]
    assert y == pytest.approx(expected) and z == pytest.approx(expected)
    with pytest.raises(KeyError, match="has no role 'ref'"):
        group.fuse(["ref"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_async_worker_methods_with_a_dispatch_mode(backend, new_group):
    """An ``async def`` method registered with a dispatch mode (verl's decorator test): a
    non-blocking DataProto call returns a ``DataProtoFuture`` whose value is the awaited result of
    every rank; a blocking one returns the collected values."""
    group = new_group(backend, RayClassWithInitArgs(cls=verl_workers.AsyncComputeWorker, initial_value=5))
    data = DataProto.from_dict(tensors={"input": torch.arange(4, dtype=torch.float32)})
    future = group.async_dp_compute(data)
    assert isinstance(future, DataProtoFuture)
    rank_of_row = torch.tensor([0, 0, 1, 1]) if backend == "ray" else torch.zeros(4)
    torch.testing.assert_close(future.get().batch["output_async"], torch.arange(4.0) * 2 + 5 + rank_of_row)
    torch.testing.assert_close(group.dp_compute(data).batch["output"], torch.arange(4.0) + 5 + rank_of_row)
    assert group.async_one_to_all(10) == [10 + rank for rank in range(ranks(backend))]
