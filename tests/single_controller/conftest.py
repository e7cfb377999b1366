"""Fixtures of the single-controller tests: one Ray cluster per test module, group factories.

Per module, not per session: other test folders start and stop Ray themselves (their own clusters,
``ray.shutdown()``), which would leave a session-wide group holding handles of a cluster that is gone."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import sc_workers
from sc_workers import BACKENDS, world_size_of

from rlvr.single_controller import ClassWithInitArgs, WorkerGroup, get_resource_pool_cls, get_worker_group_cls
from rlvr.utils.testing import local_ray_cluster



@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    """A local Ray cluster with 2 CPUs for the module's Ray tests."""
    with local_ray_cluster(2, pickle_by_value=(sc_workers,)):  # the Ray workers cannot import tests/
        yield


@pytest.fixture(scope="module", params=BACKENDS)
def demo(request: pytest.FixtureRequest) -> Iterator[tuple[str, WorkerGroup]]:
    """``(backend, group)``: one DemoWorker group per backend shared by the module's tests (start-up is slow)."""
    backend = request.param
    if backend == "ray":
        request.getfixturevalue("ray_cluster")
    pool = get_resource_pool_cls(backend)(process_on_nodes=[world_size_of(backend)], use_gpu=False)
    group = get_worker_group_cls(backend)(
        pool, ClassWithInitArgs(sc_workers.DemoWorker), name_prefix=f"demo_{backend}", call_timeout_s=60
    )
    yield backend, group
    group.shutdown()
    pool.remove()


@pytest.fixture
def make_group(request: pytest.FixtureRequest) -> Iterator[Callable[..., WorkerGroup]]:
    """``make_group(backend, ClassWithInitArgs, **group_kwargs)``; groups and pools are removed afterwards."""
    made = []

    def make(backend: str, cls_with_init: ClassWithInitArgs, **kwargs) -> WorkerGroup:
        if backend == "ray":
            request.getfixturevalue("ray_cluster")
        pool = get_resource_pool_cls(backend)(process_on_nodes=[world_size_of(backend)], use_gpu=False)
        made.append((pool, None))
        group = get_worker_group_cls(backend)(pool, cls_with_init, **kwargs)
        made[-1] = (pool, group)
        return group

    yield make
    for pool, group in made:
        if group is not None:
            group.shutdown()
        pool.remove()
