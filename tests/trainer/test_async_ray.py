"""Asynchronous training on the Ray backend: the rollout in a resource pool of its own, here on a
simulated 2-node cluster (``ray.cluster_utils.Cluster`` in this process: the training node, the
rollout node, and a head node without CPUs for the driver). Weights reach the other node through
Ray's object store (nothing is written to disk), max_staleness=0 gives the synchronous trainer's
metrics exactly, the bound holds per token, a hung weight push raises a timeout naming the rollout
worker, and losing the rollout node is survived like a killed worker: the rollout group restarts
alone on a node that takes its place, with the current weights."""

from __future__ import annotations

import pytest
import ray
from async_helpers import APART, BOUNDS, LONGER, MODES, SLOW_DECODE, VersionRecorder, comparable, faulty_rollout
from ray.util.placement_group import placement_group_table
from trainer_helpers import tiny_config

import async_helpers
import trainer_helpers
from rlvr.single_controller import RayWorkerGroup
from rlvr.trainer.main_ppo import build_role_worker_mapping
from rlvr.trainer.ppo.ray_trainer import RayPPOTrainer, ResourcePoolManager
from rlvr.trainer.ppo.reward import load_reward_manager
from rlvr.trainer.recovery import RestartLimitError
from rlvr.utils.errors import WorkerTimeoutError
from rlvr.utils.fault_injection import Fault
from rlvr.utils.tokenizer import hf_tokenizer

pytestmark = [pytest.mark.ray, pytest.mark.slow]  # a simulated 2-node cluster and full training runs

NODE = {"num_cpus": 2, "object_store_memory": 150 * 1024**2}
BASE = {"trainer.backend": "ray", "trainer.val_before_train": False, "trainer.report": False,
        "trainer.num_threads": 1, "trainer.total_training_steps": 4, "trainer.call_timeout_s": 120}
LABELS = {"global_pool": {"resources": {"train_node": 0.01}}, "rollout_pool": {"resources": {"rollout_node": 0.01}}}


@pytest.fixture(scope="module")
def cluster():
    """A head node for the driver (no CPUs) and two worker nodes labelled ``train_node`` and
    ``rollout_node``. Its address is not written where a plain ``ray.init()`` of another process
    on this machine would find and join it."""
    from ray import cluster_utils

    if ray.is_initialized():  # a local cluster an earlier test module joined and left running
        ray.shutdown()
    patch = pytest.MonkeyPatch()
    patch.setattr(ray._private.utils, "write_ray_address", lambda *args, **kwargs: None)
    nodes = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 0,
                                                                        "object_store_memory": 100 * 1024**2})
    nodes.train = nodes.add_node(**NODE, resources={"train_node": 1})
    nodes.rollout = nodes.add_node(**NODE, resources={"rollout_node": 1})
    for module in (async_helpers, trainer_helpers):
        ray.cloudpickle.register_pickle_by_value(module)
    ray.init(address=nodes.address)
    try:
        yield nodes
    finally:
        ray.shutdown()
        nodes.shutdown()
        patch.undo()


def run(cfg, reward_fn=None, mapping=None, on_step=None) -> RayPPOTrainer:
    """A run of ``cfg`` with the trainer's pools on the training node and the rollout's on the
    rollout node."""
    default, pool_of_role = build_role_worker_mapping(cfg)
    spec = {"global_pool": [1], **({"rollout_pool": [cfg.rollout.n_gpus_per_node]}
                                   if not cfg.actor_rollout_ref.hybrid_engine else {})}
    pools = ResourcePoolManager(spec, pool_of_role, use_gpu=False, backend="ray",
                                pool_options={name: LABELS[name] for name in spec})
    tokenizer = hf_tokenizer(cfg.actor_rollout_ref.model.path)
    trainer = RayPPOTrainer(cfg, tokenizer, mapping or default, pools, ray_worker_group_cls=RayWorkerGroup,
                            reward_fn=reward_fn or load_reward_manager(cfg, tokenizer, num_examine=0),
                            val_reward_fn=load_reward_manager(cfg, tokenizer, num_examine=0), device_name="cpu")
    try:
        trainer.init_workers()
        if on_step is not None:
            on_step(trainer, pools)
        trainer.fit()
    finally:
        trainer.shutdown()
    return trainer


def node_of(pools: ResourcePoolManager, pool: str) -> str:
    pg = pools.resource_pool_dict[pool].get_placement_groups()[0]
    return placement_group_table(pg)["bundles_to_node_id"][0]


def test_max_staleness_0_on_two_nodes_gives_the_synchronous_trainers_metrics_exactly(cluster, tiny_model_dir,
                                                                                     tiny_data, tmp_path):
    colocated = run(tiny_config(tiny_model_dir, tiny_data, tmp_path / "colocated", **BASE))
    placed = {}
    apart = run(tiny_config(tiny_model_dir, tiny_data, tmp_path / "apart", **BASE, **APART,
                            **{"async_training.max_staleness": 0, "async_training.mode": "bounded"}),
                on_step=lambda trainer, pools: placed.update(train=node_of(pools, "global_pool"),
                                                             rollout=node_of(pools, "rollout_pool")))
    assert placed == {"train": cluster.train.node_id, "rollout": cluster.rollout.node_id}
    assert comparable(apart.metrics_history) == comparable(colocated.metrics_history)
    assert [row["async/staleness_max"] for row in apart.metrics_history[:4]] == [0.0] * 4


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["one_step", "bounded_drop_partial"])
def test_the_staleness_bound_holds_for_every_token_across_nodes(cluster, tiny_model_dir, tiny_data, tmp_path, mode):
    """one_step with one rollout worker; bounded with two (each a rank of the rollout group, taking
    the pushes at their own moments: a call's ranks may end on different versions)."""
    workers = {"rollout.n_gpus_per_node": 2, **SLOW_DECODE} if mode != "one_step" else {}
    cfg = tiny_config(tiny_model_dir, tiny_data, tmp_path / mode, **BASE, **MODES[mode], **LONGER, **workers)
    recorder = VersionRecorder(cfg, hf_tokenizer(str(tiny_model_dir)))
    trainer = run(cfg, reward_fn=recorder)
    staleness = recorder.staleness()
    assert len(staleness) == 4 and max(max(s) for s in staleness) <= BOUNDS[mode]
    if mode == "one_step":
        assert staleness == [[0] * 16] + [[1] * 16] * 3
    else:  # each rollout worker's generations are slower than a training step: pushes land inside them
        rows = recorder.mixed_rows()
        assert rows and all(bool((row[1:] >= row[:-1]).all()) for row in rows)
    assert [row["async/policy_version"] for row in trainer.metrics_history[:4]] == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.slow
def test_a_hung_weight_push_to_the_rollout_node_raises_a_timeout_naming_the_worker(cluster, tiny_model_dir, tiny_data,
                                                                                 tmp_path):
    extra = {**BASE, **MODES["one_step"], "async_training.weight_sync_timeout_s": 5, "trainer.max_restarts": 0}
    cfg = tiny_config(tiny_model_dir, tiny_data, tmp_path / "hung", **extra)
    marker = tmp_path / "hung-push"
    with pytest.raises(RestartLimitError) as info:
        run(cfg, mapping=faulty_rollout(cfg, Fault("update_weights", rank=0, call=2, kind="hang", marker=str(marker))))
    assert marker.exists()
    assert "call timed out in worker group 'rollout_" in str(info.value)
    assert "method 'update_weights', rank 0" in str(info.value)
    (cause,) = info.value.__cause__.exceptions
    assert isinstance(cause, WorkerTimeoutError) and "no result from rank(s) [0] within 5.0 s" in str(cause)


class LoseTheRolloutNode:
    """A reward function that, in its ``call``-th call, removes the rollout node from the cluster
    and adds another with the same label (the rollout's worker dies with its node)."""

    def __init__(self, inner, cluster, call: int) -> None:
        self.inner, self.cluster, self.call, self.calls, self.replacement = inner, cluster, call, 0, None

    def __call__(self, data, return_dict=False):
        self.calls += 1
        if self.calls == self.call:
            self.cluster.remove_node(self.cluster.rollout)
            self.replacement = self.cluster.add_node(**NODE, resources={"rollout_node": 1})
        return self.inner(data, return_dict=return_dict)


@pytest.mark.slow  # a node of the cluster removed and another started
def test_losing_the_rollout_node_is_survived_like_a_killed_worker(cluster, tiny_model_dir, tiny_data, tmp_path):
    cfg = tiny_config(tiny_model_dir, tiny_data, tmp_path / "lost", **BASE, **MODES["one_step"])
    recorder = VersionRecorder(cfg, hf_tokenizer(str(tiny_model_dir)))
    losing = LoseTheRolloutNode(recorder, cluster, call=2)
    trainer = run(cfg, reward_fn=losing)
    cluster.rollout = losing.replacement  # the module's cluster goes on with the new node
    assert [row["step"] for row in trainer.metrics_history] == [1, 2, 3, 4, 4]
    (restart,) = trainer.recovery.restarts
    assert restart.group.startswith("rollout_") and restart.restored_step is None
    assert restart.cause == "worker died"
    assert max(max(s) for s in recorder.staleness()) <= 1
    third = recorder.batches[2]  # generated again by the restarted rollout: with pushed weights, not the start's
    assert third["versions"][third["mask"].bool()].min() >= 1
