"""The rollout's scale keys (rlvr.trainer.config.validate_rollout_scale): engines that fit the rollout
workers, what rlvr does not run refused with the key and the reason."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from rlvr.trainer.config.schema import RlvrConfig
from rlvr.trainer.config.validate_rollout_scale import check_rollout_scale, rollout_workers
from rlvr.utils.errors import ConfigError

KEY = "actor_rollout_ref.rollout"


def _config(*overrides: str):
    return OmegaConf.merge(OmegaConf.structured(RlvrConfig), OmegaConf.from_dotlist(
        [f"{KEY}.name=vllm", "trainer.backend=ray", "trainer.n_gpus_per_node=4", *overrides]))


def test_engines_that_fit_the_workers_are_accepted():
    for tp, dp in ((1, 1), (2, 1), (4, 1), (2, 2), (1, 4)):
        check_rollout_scale(_config(f"{KEY}.tensor_model_parallel_size={tp}", f"{KEY}.data_parallel_size={dp}"))
    check_rollout_scale(_config(f"{KEY}.mode=async", f"{KEY}.tensor_model_parallel_size=8"))  # servers: their own ranks
    check_rollout_scale(_config(f"{KEY}.mode=async", f"{KEY}.tensor_model_parallel_size=2",
                                f"{KEY}.server.cpu_binds=['0|1']", f"{KEY}.server.num_replicas=1"))
    assert rollout_workers(_config()) == 4
    assert rollout_workers(_config("trainer.backend=local")) == 1
    assert rollout_workers(_config("actor_rollout_ref.hybrid_engine=false", "rollout.n_gpus_per_node=2")) == 2


@pytest.mark.parametrize(("overrides", "key", "message"), [
    ((f"{KEY}.tensor_model_parallel_size=3",), "tensor_model_parallel_size",
     "4 rollout worker.s. do not split into engines of tensor_model_parallel_size=3 x data_parallel_size=1"),
    ((f"{KEY}.tensor_model_parallel_size=2", "trainer.backend=local"), "tensor_model_parallel_size",
     "the local backend has one worker"),
    ((f"{KEY}.tensor_model_parallel_size=2", "actor_rollout_ref.hybrid_engine=false", "rollout.n_gpus_per_node=1"),
     "tensor_model_parallel_size", "1 rollout worker"),
    ((f"{KEY}.tensor_model_parallel_size=2", f"{KEY}.agent.default_agent_loop=tool_agent"),
     "tensor_model_parallel_size", "must issue the same requests"),
    ((f"{KEY}.tensor_model_parallel_size=0",), "tensor_model_parallel_size", "must be >= 1"),
    ((f"{KEY}.mode=async", f"{KEY}.data_parallel_size=2"), "data_parallel_size", "server.num_replicas"),
    ((f"{KEY}.pipeline_model_parallel_size=2",), "pipeline_model_parallel_size", "tensor parallelism only"),
    ((f"{KEY}.mode=async", f"{KEY}.tensor_model_parallel_size=2", f"{KEY}.server.cpu_binds=['0-1']"),
     "server.cpu_binds", "binds 1 worker.s., but each replica runs tensor_model_parallel_size=2"),
    ((f"{KEY}.mode=async", f"{KEY}.server.port=8100"), "server.port", "cannot all listen on port 8100"),
    ((f"{KEY}.expert_parallel_size=0",), "expert_parallel_size", "must be >= 1"),
    ((f"{KEY}.name=hf", f"{KEY}.tensor_model_parallel_size=2"), "tensor_model_parallel_size",
     "apply to rollout.name=vllm"),
])
def test_what_does_not_fit_is_refused_with_the_key(overrides, key, message):
    with pytest.raises(ConfigError, match=message) as err:
        check_rollout_scale(_config(*overrides))
    assert err.value.key == f"{KEY}.{key}"
