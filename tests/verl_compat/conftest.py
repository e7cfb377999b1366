"""Fixtures of the verl-user acceptance suite: one Ray cluster per test module, group factories."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import verl_workers

from rlvr.utils.testing import local_ray_cluster

RAY_WORKERS = 2


@pytest.fixture(scope="module")
def verl_ray_cluster() -> Iterator[None]:
    """A local Ray cluster with 2 CPUs for the module's Ray tests (other folders stop Ray themselves)."""
    with local_ray_cluster(2, pickle_by_value=(verl_workers,)):  # the Ray workers cannot import tests/
        yield


@pytest.fixture
def new_group(request: pytest.FixtureRequest) -> Iterator[Callable]:
    """``new_group(backend, ray_cls_with_init, pool=None, **kwargs)`` built as a verl user builds a
    group (``RayResourcePool`` + ``RayWorkerGroup``, or the local equivalents); shut down afterwards."""
    from rlvr.single_controller import LocalResourcePool, LocalWorkerGroup

    made = []

    def new(backend: str, ray_cls_with_init, pool=None, **kwargs):
        if backend == "ray":
            request.getfixturevalue("verl_ray_cluster")
            from rlvr.single_controller.ray.base import RayResourcePool, RayWorkerGroup

            pool = pool or RayResourcePool([RAY_WORKERS], use_gpu=False)
            group = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=ray_cls_with_init, device_name="cpu", **kwargs)
        else:
            pool = pool or LocalResourcePool([1])
            group = LocalWorkerGroup(resource_pool=pool, ray_cls_with_init=ray_cls_with_init, device_name="cpu", **kwargs)
        made.append((pool, group))
        return group

    yield new
    for pool, group in reversed(made):
        group.shutdown()
        pool.remove()
