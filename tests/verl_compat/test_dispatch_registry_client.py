"""verl 0.9's dispatch-mode registry at verl's module path, used as verl code uses it (no Ray)."""

from __future__ import annotations

import pickle

import pytest
import torch

import rlvr.single_controller.base.decorator as decorator_module
from rlvr import DataProto
from rlvr.single_controller.base import Worker
from rlvr.single_controller.base.decorator import (
    DISPATCH_MODE_FN_REGISTRY,
    Dispatch,
    Execute,
    collect_all_to_all,
    dispatch_one_to_all,
    get_predefined_dispatch_fn,
    register,
    register_dispatch_mode,
    update_dispatch_mode,
)
from rlvr.single_controller.ray import RayClassWithInitArgs
from rlvr.single_controller.local import LocalResourcePool, LocalWorkerGroup


@pytest.fixture
def restore_registry():
    """verl's pattern: copy the registry, then clear() and update() it back."""
    saved = DISPATCH_MODE_FN_REGISTRY.copy()
    yield
    decorator_module.DISPATCH_MODE_FN_REGISTRY.clear()
    decorator_module.DISPATCH_MODE_FN_REGISTRY.update(saved)


def times_ten_dispatch(worker_group, *args, **kwargs):
    """Every rank gets ``10 * arg``."""
    n = worker_group.world_size
    return tuple([10 * a] * n for a in args), {k: [10 * v] * n for k, v in kwargs.items()}


def first_output(worker_group, output):
    return output[0]


def test_predefined_modes_are_dict_entries():
    assert get_predefined_dispatch_fn(Dispatch.ONE_TO_ALL) == {
        "dispatch_fn": dispatch_one_to_all, "collect_fn": collect_all_to_all,
    }
    names = Dispatch.names()
    for name in ("RANK_ZERO", "ONE_TO_ALL", "ALL_TO_ALL", "DP_COMPUTE", "DP_COMPUTE_PROTO",
                 "DP_COMPUTE_PROTO_WITH_FUNC", "DP_COMPUTE_METRIC"):
        assert name in names and name in Dispatch and Dispatch[name] is getattr(Dispatch, name)
    assert Dispatch.DP_COMPUTE_PROTO in DISPATCH_MODE_FN_REGISTRY
    assert pickle.loads(pickle.dumps(Dispatch.DP_COMPUTE_PROTO)) is Dispatch.DP_COMPUTE_PROTO


def test_register_use_update_and_remove_a_mode(restore_registry):
    mode = register_dispatch_mode("times_ten", times_ten_dispatch, first_output)
    assert mode is Dispatch.TIMES_TEN and isinstance(mode, Dispatch)
    assert get_predefined_dispatch_fn(Dispatch.TIMES_TEN) == {"dispatch_fn": times_ten_dispatch, "collect_fn": first_output}
    with pytest.raises(ValueError):  # the name is taken
        register_dispatch_mode("TIMES_TEN", times_ten_dispatch, first_output)

    class Echo(Worker):
        @register(dispatch_mode=Dispatch.TIMES_TEN)
        def echo(self, x):
            return x + 1

    group = LocalWorkerGroup(LocalResourcePool([1]), RayClassWithInitArgs(cls=Echo))
    assert group.echo(4) == 41  # dispatched as 40, rank 0's output collected

    update_dispatch_mode(Dispatch.TIMES_TEN, dispatch_one_to_all, collect_all_to_all)
    assert get_predefined_dispatch_fn(Dispatch.TIMES_TEN)["dispatch_fn"] is dispatch_one_to_all
    assert group.echo(4) == 41  # a group keeps the functions it bound
    assert LocalWorkerGroup(LocalResourcePool([1]), RayClassWithInitArgs(cls=Echo)).echo(4) == [5]
    Dispatch.remove("TIMES_TEN")
    assert "TIMES_TEN" not in Dispatch


def test_registry_misuse_raises_verl_types(restore_registry):
    with pytest.raises(AssertionError):
        update_dispatch_mode({"dispatch_fn": print, "collect_fn": print}, print, print)
    with pytest.raises(KeyError):
        get_predefined_dispatch_fn(Dispatch.register("NOT_IN_REGISTRY"))
    Dispatch.remove("NOT_IN_REGISTRY")
    with pytest.raises(AssertionError):
        register(dispatch_mode="one_to_all")
    with pytest.raises(AssertionError):
        register(dispatch_mode={"dispatch_fn": print})
    with pytest.raises(AssertionError):
        register(execute_mode="all")
    assert register(dispatch_mode={"dispatch_fn": print, "collect_fn": print, "note": "extra keys are fine"})


class Doubler(Worker):
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def double(self, data: DataProto) -> DataProto:
        data.batch["a"] *= 2
        return data

    @register(dispatch_mode=Dispatch.ALL_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def rank_zero_sum(self, x, y):
        return x + y


def test_local_group_takes_a_ray_remote_class_and_copies_arguments():
    ray = pytest.importorskip("ray")
    wrapped = ray.remote(num_cpus=1)(Doubler)  # how verl users fill role_worker_mapping
    group = LocalWorkerGroup(LocalResourcePool([1]), RayClassWithInitArgs(cls=wrapped))
    data = DataProto.from_dict({"a": torch.arange(3.0)})
    assert group.double(data).batch["a"].tolist() == [0.0, 2.0, 4.0]
    assert data.batch["a"].tolist() == [0.0, 1.0, 2.0]  # the caller's batch is not changed, as with Ray
    assert group.rank_zero_sum(1, 2) == 3
    assert group.execute_func_rank_zero(abs, -5) == 5
