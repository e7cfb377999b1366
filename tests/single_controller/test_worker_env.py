"""The environment every worker starts with, as verl sets it, the user's own variables, and a Ray
that the user started being reused.

verl's rules: ``RANK`` / ``WORLD_SIZE`` place a worker in its group, ``RAY_LOCAL_RANK`` /
``RAY_LOCAL_WORLD_SIZE`` among the group's workers on its node, ``LOCAL_RANK`` / ``LOCAL_WORLD_SIZE``
among the devices its process sees (a Ray actor sees only its own: 0 and 1), ``MASTER_ADDR`` /
``MASTER_PORT`` are rank 0's rendezvous, the same in every worker; ``worker_env=`` adds variables and
may not replace one of those (``ValueError`` naming it).
"""

from __future__ import annotations

import pytest
from sc_workers import SEPARATE_PROCESS_BACKENDS, EnvWorker

from rlvr.single_controller import ClassWithInitArgs, get_resource_pool_cls, get_worker_group_cls
from rlvr.single_controller.base.worker import NOSET_VISIBLE_DEVICES, noset_local_rank
from rlvr.single_controller.base.worker_group import with_worker_env
from rlvr.utils.errors import ProtocolError

# (RANK, WORLD_SIZE, RAY_LOCAL_RANK, RAY_LOCAL_WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE) of each rank
PLACES = {
    # two placement groups stand for two nodes of 2 and 1 workers; an actor sees only its own GPU
    "ray": [("0", "3", "0", "2", "0", "1"), ("1", "3", "1", "2", "0", "1"), ("2", "3", "0", "1", "0", "1")],
    "process": [("0", "2", "0", "2", "0", "2"), ("1", "2", "1", "2", "1", "2")],  # children see every GPU
    "local": [("0", "1", "0", "1", "0", "1")],
}
PLACE_KEYS = ("RANK", "WORLD_SIZE", "RAY_LOCAL_RANK", "RAY_LOCAL_WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
USER_KEYS = ("RLVR_TEST_FROM_CLASS", "RLVR_TEST_FROM_GROUP", "RLVR_TEST_BOTH")


@pytest.fixture
def env_group(request: pytest.FixtureRequest):
    """``make(backend)``: a group of :class:`EnvWorker` on 2 + 1 "nodes" (Ray), 2 children (process) or 1
    (local); on Ray and process the class comes from ``ray.remote(runtime_env=...)`` and the group gets a
    ``worker_env`` (the local backend refuses both)."""
    made = []

    def make(backend: str):
        import ray  # ray.remote only wraps the class here; it starts nothing

        if backend == "ray":
            request.getfixturevalue("ray_cluster")
        pool = get_resource_pool_cls(backend)({"ray": [2, 1], "process": [2], "local": [1]}[backend], use_gpu=False)
        made.append((pool, None))
        if backend == "local":
            cls, user = ClassWithInitArgs(EnvWorker), {}
        else:
            env_vars = {"RLVR_TEST_FROM_CLASS": "class", "RLVR_TEST_BOTH": "class"}
            cls = ClassWithInitArgs(ray.remote(runtime_env={"env_vars": env_vars})(EnvWorker), extra_keys=USER_KEYS)
            user = {"worker_env": {"RLVR_TEST_FROM_GROUP": "group", "RLVR_TEST_BOTH": "group"}}
        group = get_worker_group_cls(backend)(pool, cls, name_prefix=f"env_{backend}", call_timeout_s=60, **user)
        made[-1] = (pool, group)
        return group

    yield make
    for pool, group in made:
        if group is not None:
            group.shutdown()
        pool.remove()


@pytest.mark.slow_on("process")
@pytest.mark.parametrize("backend", [pytest.param("ray", marks=[pytest.mark.ray, pytest.mark.slow]), "process", "local"])
def test_every_worker_starts_with_verls_variables_and_the_users(backend, env_group):
    group = env_group(backend)
    envs = group.env_at_init()
    assert [tuple(env[key] for key in PLACE_KEYS) for env in envs] == PLACES[backend]
    assert {(env["WG_PREFIX"], env["WG_BACKEND"]) for env in envs} == {(f"env_{backend}", backend)}
    [(addr, port)] = {(env["MASTER_ADDR"], env["MASTER_PORT"]) for env in envs}  # one rendezvous for all
    assert port.isdigit() and 0 < int(port) < 65536
    if backend == "local":
        assert addr == "127.0.0.1"
        return
    # worker_env is added to the class's runtime_env env_vars (not replacing them) and wins a clash
    assert {tuple(env[key] for key in USER_KEYS) for env in envs} == {("class", "group", "group")}
    # a worker's methods see the variables too (verl's own check reads them with execute_all_sync)
    assert group.execute_all_sync("getenv", key="RLVR_TEST_FROM_GROUP") == ["group"] * len(envs)
    assert group.execute_all_sync("getenv", key="RAY_LOCAL_RANK") == [place[2] for place in PLACES[backend]]
    if backend == "ray":
        import ray

        assert addr == ray.util.get_node_ip_address()
    else:
        assert addr == "127.0.0.1"


@pytest.mark.parametrize("backend", SEPARATE_PROCESS_BACKENDS)
@pytest.mark.parametrize("key", ["WORLD_SIZE", "RAY_LOCAL_RANK", "MASTER_PORT"])
def test_worker_env_cannot_replace_a_variable_of_the_group(backend, key, make_group):
    name = f"env_clash_{backend}"
    with pytest.raises(ValueError, match=f"cannot override protected system env .*'{key}'"):
        make_group(backend, ClassWithInitArgs(EnvWorker), name_prefix=name, call_timeout_s=60, worker_env={key: "100"})
    if backend == "ray":
        import ray

        with pytest.raises(ValueError):  # refused before any worker started
            ray.get_actor(f"{name}_rank0")


def test_the_local_backend_refuses_an_environment_of_its_own(make_group):
    with pytest.raises(ProtocolError, match="driver process"):
        make_group("local", ClassWithInitArgs(EnvWorker), worker_env={"RLVR_TEST_FROM_GROUP": "group"})


@pytest.mark.ray
def test_groups_use_the_ray_the_user_started(ray_cluster, monkeypatch):
    """A verl user calls ``ray.init()`` and then builds groups: rlvr must not start Ray again, and a
    group that is refused leaves that Ray running for the next one."""
    import ray

    from rlvr.single_controller import init_ray
    from rlvr.single_controller.ray.base import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

    def second_init(*args, **kwargs):
        raise AssertionError("rlvr called ray.init while Ray was running")

    monkeypatch.setattr(ray, "init", second_init)
    init_ray()  # what the trainer's entry point calls: nothing to do on a running Ray
    pool = RayResourcePool([1], use_gpu=False)
    try:
        with pytest.raises(ValueError, match="RANK"):
            RayWorkerGroup(pool, RayClassWithInitArgs(EnvWorker), name_prefix="env_refused", worker_env={"RANK": "3"})
        assert ray.is_initialized()
        group = RayWorkerGroup(pool, RayClassWithInitArgs(EnvWorker), name_prefix="env_reuse", call_timeout_s=60)
        assert group.execute_all_sync("getenv", key="RANK") == ["0"]
        group.shutdown()
    finally:
        pool.remove()


def test_with_worker_env_adds_the_users_variables_and_names_every_clash():
    system = {"RANK": "1", "WORLD_SIZE": "2"}
    assert with_worker_env("g", system, system, {"A": "class", "B": 1}, {"A": "group"}) == {
        "RANK": "1", "WORLD_SIZE": "2", "A": "group", "B": "1"}  # later sources win; values become strings
    with pytest.raises(ValueError, match=r"worker group 'g': cannot override protected system env \['RANK', 'WORLD_SIZE'\]"):
        with_worker_env("g", system, system, None, {"WORLD_SIZE": "9", "RANK": "0", "C": "3"})


def test_local_rank_is_the_gpu_ray_gave_when_every_gpu_is_visible():
    assert noset_local_rank({}, ["3"]) is None  # Ray set CUDA_VISIBLE_DEVICES: the actor's GPU is index 0
    assert noset_local_rank({NOSET_VISIBLE_DEVICES: "1"}, ["3", "5"]) == "3"
    assert noset_local_rank({NOSET_VISIBLE_DEVICES: ""}, ["3"]) is None
    assert noset_local_rank({NOSET_VISIBLE_DEVICES: "1"}, []) is None  # a CPU actor
