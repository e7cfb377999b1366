"""Fixtures of the worker tests: the tiny model's folder, and Ray worker groups.

A module sets ``RAY_RANKS`` (default 2) for the CPUs of its Ray cluster and the ranks of each
group that ``ray_groups`` makes.
"""

from __future__ import annotations

import pytest

from rlvr.utils.testing import local_ray_cluster, save_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    """The tiny Llama (seed 0) and its tokenizer, saved once per module."""
    return str(save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0))


@pytest.fixture(scope="module")
def ray_cluster(request):
    with local_ray_cluster(getattr(request.module, "RAY_RANKS", 2)):
        yield


@pytest.fixture
def ray_groups(ray_cluster, request):
    """``make(cls, *args)``: a Ray worker group of ``RAY_RANKS`` CPU ranks of ``cls(*args)``, its model
    initialised; every group made is shut down and its pool removed after the test."""
    from rlvr.single_controller import ClassWithInitArgs, RayResourcePool, RayWorkerGroup

    made = []

    def make(cls, *args):
        pool = RayResourcePool(process_on_nodes=[getattr(request.module, "RAY_RANKS", 2)], use_gpu=False)
        group = RayWorkerGroup(pool, ClassWithInitArgs(cls, *args))
        made.append((pool, group))
        group.init_model()
        return group

    yield make
    for pool, group in made:
        group.shutdown()
        pool.remove()
