"""Config checks of the rollout's scale settings (verl's keys under ``actor_rollout_ref.rollout``):
``tensor_model_parallel_size``, ``data_parallel_size``, ``pipeline_model_parallel_size``,
``expert_parallel_size``, before anything starts (what ``expert_parallel_size > 1`` needs is checked
with the other mixture-of-experts keys: :mod:`rlvr.trainer.config.moe_checks`).

In-process engines (``rollout.mode=sync``) sit on the rollout workers: every
``tensor_model_parallel_size`` consecutive workers hold one engine (:mod:`rlvr.workers.rollout.placement`),
and a replica of ``tensor x data`` parallel workers is ``data_parallel_size`` engines (for a dense
model vLLM's data parallelism is independent engines). Server replicas (``rollout.mode=async``) take
the tensor-parallel size as their own (``--tensor-parallel-size``); their data parallelism is
``rollout.server.num_replicas``.
"""

from __future__ import annotations

from omegaconf import DictConfig

from rlvr.trainer.config.async_checks import rollout_apart, rollout_world_size
from rlvr.utils.errors import ConfigError

__all__ = ["check_rollout_scale", "rollout_workers"]

KEY = "actor_rollout_ref.rollout"


def _require(condition: bool, key: str, message: str) -> None:
    if not condition:
        raise ConfigError(key, message)


def rollout_workers(cfg: DictConfig) -> int:
    """Workers that generate: the actor's group (hybrid engine), else the rollout pool."""
    if rollout_apart(cfg):
        return rollout_world_size(cfg)
    return 1 if cfg.trainer.backend == "local" else cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node


def check_rollout_scale(cfg: DictConfig) -> None:
    """The scale keys: sizes >= 1; engines that fit the rollout workers; what rlvr does not run refused
    with the reason."""
    rollout = cfg.actor_rollout_ref.rollout
    tp, dp = rollout.tensor_model_parallel_size, rollout.data_parallel_size
    for name in ("tensor_model_parallel_size", "data_parallel_size", "pipeline_model_parallel_size",
                 "expert_parallel_size"):
        _require(rollout[name] >= 1, f"{KEY}.{name}", f"must be >= 1, got {rollout[name]}")
    _require(rollout.pipeline_model_parallel_size == 1, f"{KEY}.pipeline_model_parallel_size",
             "rlvr's rollout engines split the model by tensor parallelism only (vLLM's pipeline stages are not "
             "placed on the rollout workers); set it to 1 and use tensor_model_parallel_size")
    if rollout.name == "hf":
        _require(tp == 1 and dp == 1, f"{KEY}.tensor_model_parallel_size" if tp != 1 else f"{KEY}.data_parallel_size",
                 "the hf engine holds the whole model on every rollout worker (each worker is a data-parallel engine "
                 "already); tensor_model_parallel_size and data_parallel_size apply to rollout.name=vllm: set them to 1")
        return
    if rollout.mode == "async":
        _require(dp == 1, f"{KEY}.data_parallel_size",
                 "server replicas are rlvr's data parallelism in rollout.mode=async: set data_parallel_size=1 and "
                 "rollout.server.num_replicas to the number of engines (each with tensor_model_parallel_size ranks)")
        for i, bind in enumerate(rollout.server.cpu_binds):
            _require(len(str(bind).split("|")) == tp, f"{KEY}.server.cpu_binds",
                     f"entry {i} ({bind!r}) binds {len(str(bind).split('|'))} worker(s), but each replica runs "
                     f"tensor_model_parallel_size={tp}: give one core list per worker joined by '|' (vLLM's "
                     "VLLM_CPU_OMP_THREADS_BIND), e.g. '0|1'")
        _require(rollout_workers(cfg) == 1 or rollout.server.urls or rollout.server.port == 0, f"{KEY}.server.port",
                 f"each of the {rollout_workers(cfg)} rollout workers starts its own managed replicas, which cannot all "
                 f"listen on port {rollout.server.port}: set server.port=0 (free ports)")
        return
    workers = rollout_workers(cfg)
    _require(workers % (tp * dp) == 0, f"{KEY}.tensor_model_parallel_size",
             f"{workers} rollout worker(s) do not split into engines of tensor_model_parallel_size={tp} x "
             f"data_parallel_size={dp} ranks: each in-process engine spans {tp} consecutive workers; use sizes whose "
             "product divides the workers (trainer.n_gpus_per_node x trainer.nnodes, or the rollout pool's; the "
             "local backend has one worker: use trainer.backend=ray), or rollout.mode=async (servers)")
    _require(tp == 1 or rollout.agent.default_agent_loop == "single_turn", f"{KEY}.tensor_model_parallel_size",
             f"the ranks of an in-process engine with tensor_model_parallel_size={tp} must issue the same requests, "
             f"so they all run the agent loop on the same rows; agent_loop {rollout.agent.default_agent_loop!r} "
             "calls tools whose results may differ between the ranks: use rollout.mode=async (servers with "
             "tensor parallelism) or tensor_model_parallel_size=1")
