"""Checks of the rollout placement (``actor_rollout_ref.hybrid_engine``, the top-level ``rollout``
pool) and of the asynchronous schedule (``async_training``); imports neither torch nor Ray.

Everything that would make an async run hang, or silently train on samples older than the bound,
is refused here, before any worker starts: a schedule that needs a rollout of its own without one,
a weight-push period longer than the staleness bound allows (the rollout would wait for weights
that never come), partial rollouts outside the bounded mode.
"""

from __future__ import annotations

from omegaconf import DictConfig

from rlvr.trainer.config.schema import ASYNC_MODES, STALENESS_POLICIES
from rlvr.utils.errors import ConfigError
from rlvr.workers.moe import router_replay_mode

__all__ = ["rollout_apart", "rollout_world_size", "staleness_bound", "decoupled_ppo", "prox_from_update_blockers",
           "lend_idle_cores_blockers", "check_async_training"]

KEY = "async_training"


def rollout_apart(cfg: DictConfig) -> bool:
    """Whether the rollout runs in a worker group of its own (``hybrid_engine=false``)."""
    return not cfg.actor_rollout_ref.hybrid_engine


def rollout_world_size(cfg: DictConfig) -> int:
    """Rollout workers of a rollout apart: the ``rollout`` pool on Ray, one child process locally."""
    if cfg.trainer.backend == "local":
        return 1
    return cfg.rollout.nnodes * cfg.rollout.n_gpus_per_node


def staleness_bound(cfg: DictConfig) -> int:
    """The most weight versions a trained sample may lag: 0 for ``sync``, 1 for ``one_step``,
    ``max_staleness`` for ``bounded``."""
    mode = cfg.async_training.mode
    return {"sync": 0, "one_step": 1}.get(mode, cfg.async_training.max_staleness)


def decoupled_ppo(cfg: DictConfig) -> bool:
    """Whether the actor's proximal log-probs are the old policy of a rollout apart from it, the
    engine's the behaviour policy (``compute_prox_log_prob``; None = when samples can be stale)."""
    choice = cfg.async_training.compute_prox_log_prob
    return rollout_apart(cfg) and (staleness_bound(cfg) > 0 if choice is None else bool(choice))


def prox_from_update_blockers(cfg: DictConfig, reads_old_log_prob: bool = False) -> list[str]:
    """Why the proximal log-probs cannot come from the update's own forward pass (empty: they can,
    exactly): it must be the only optimizer step of the batch, and nothing before the update may
    need them.

    Args:
        cfg: the run config.
        reads_old_log_prob: the advantage estimator reads ``old_log_prob`` (its registry entry).
    """
    actor, algo = cfg.actor_rollout_ref.actor, cfg.algorithm
    rc = algo.rollout_correction
    checks = [
        (actor.ppo_epochs != 1, f"actor.ppo_epochs={actor.ppo_epochs} (only the first optimizer step starts "
                                "from the proximal policy)"),
        (actor.ppo_mini_batch_size < cfg.data.train_batch_size,
         f"actor.ppo_mini_batch_size={actor.ppo_mini_batch_size} < data.train_batch_size={cfg.data.train_batch_size} "
         "(several optimizer steps per batch)"),
        (actor.strategy == "megatron", "actor.strategy=megatron (its update recomputes them)"),
        (rc.rollout_rs is not None, "algorithm.rollout_correction.rollout_rs (the rejection changes response_mask "
                                    "before the advantages)"),
        (bool(rc.bypass_mode), "algorithm.rollout_correction.bypass_mode (the rollout's log-probs are the old ones)"),
        (bool(algo.use_kl_in_reward), "algorithm.use_kl_in_reward (the KL penalty reads them before the update)"),
        (reads_old_log_prob, f"algorithm.adv_estimator={algo.adv_estimator} reads old_log_prob"),
        (router_replay_mode(actor) == "R2", "router_replay.mode=R2 (the actor's log-prob pass records the routes "
                                            "the update replays)"),
        (bool(actor.calculate_sum_pi_squared), "actor.calculate_sum_pi_squared (the old-log-prob pass computes it)"),
    ]
    return [reason for blocked, reason in checks if blocked]


def lend_idle_cores_blockers(cfg: DictConfig) -> list[str]:
    """Why ``async_training.lend_idle_cores`` cannot apply to ``cfg`` (empty: it can)."""
    t, blockers = cfg.trainer, []
    if not rollout_apart(cfg):
        blockers.append("the rollout is colocated with the actor (set actor_rollout_ref.hybrid_engine=false)")
    if t.backend != "local":
        blockers.append(f"trainer.backend={t.backend} (Ray places the workers itself; use trainer.backend=local)")
    if t.device not in ("cpu", "auto"):
        blockers.append(f"trainer.device={t.device} (GPUs are not lent; use cpu)")
    if t.num_threads is not None:
        blockers.append(f"trainer.num_threads={t.num_threads} fixes the thread count (unset it)")
    return blockers


def _require(condition: bool, key: str, message: str) -> None:
    if not condition:
        raise ConfigError(key, message)


def check_async_training(cfg: DictConfig, needs_greedy_baseline: bool, reads_old_log_prob: bool = False) -> None:
    """Raise :class:`ConfigError` for a placement or schedule that cannot run.

    Args:
        cfg: the run config.
        needs_greedy_baseline: the estimator's registry entry asks for a greedy baseline (ReMax).
        reads_old_log_prob: the estimator's registry entry reads ``old_log_prob``.
    """
    a = cfg.async_training
    _require(a.mode in ASYNC_MODES, f"{KEY}.mode", f"{a.mode!r} is not valid; use one of {', '.join(ASYNC_MODES)}")
    _require(a.staleness_policy in STALENESS_POLICIES, f"{KEY}.staleness_policy",
             f"{a.staleness_policy!r} is not valid; use one of {', '.join(STALENESS_POLICIES)}")
    _require(a.max_staleness >= 0, f"{KEY}.max_staleness", "must be >= 0 weight versions (0 = synchronous)")
    _require(a.trigger_parameter_sync_step >= 1, f"{KEY}.trigger_parameter_sync_step", "must be >= 1 actor update")
    _require(a.queue_timeout_s > 0 and a.weight_sync_timeout_s > 0, f"{KEY}.queue_timeout_s",
             "queue_timeout_s and weight_sync_timeout_s must be > 0 seconds")
    if a.lend_idle_cores:
        blockers = lend_idle_cores_blockers(cfg)
        _require(not blockers, f"{KEY}.lend_idle_cores",
                 "it lends cores between the trainer and a rollout child process on one CPU machine, but "
                 + "; ".join(blockers) + ". Change those settings or unset it")
    if not rollout_apart(cfg):
        _require(a.mode == "sync", f"{KEY}.mode",
                 f"mode={a.mode} overlaps generation and training, which needs a rollout of its own: set "
                 "actor_rollout_ref.hybrid_engine=false (the rollout then runs in the top-level rollout pool; "
                 "on the local backend in a child process)")
        return
    _check_placement(cfg, needs_greedy_baseline)
    if a.mode == "one_step":
        _require(a.max_staleness == 1 and a.staleness_policy == "wait" and a.trigger_parameter_sync_step == 1,
                 f"{KEY}.mode", "one_step is the bounded schedule with max_staleness=1, wait and a weight push "
                 "after every update; for other settings use mode=bounded")
    if a.prox_log_prob_from_update:
        _require(decoupled_ppo(cfg), f"{KEY}.prox_log_prob_from_update",
                 "there are no proximal log-probs to take from the update without decoupled PPO (mode=sync or "
                 "compute_prox_log_prob=false); unset it")
        blockers = prox_from_update_blockers(cfg, reads_old_log_prob)
        _require(not blockers, f"{KEY}.prox_log_prob_from_update",
                 "the update's forward pass is not the proximal policy's here: " + "; ".join(blockers)
                 + ". Unset it (the actor then recomputes them) or change those settings")
    _require(not a.partial_rollout or a.mode == "bounded", f"{KEY}.partial_rollout",
             f"partial rollouts interrupt generations at a weight update, which only mode=bounded does while it "
             f"generates (mode={a.mode}); set mode=bounded or partial_rollout=false")
    bound = staleness_bound(cfg)
    _require(a.staleness_policy == "drop" or a.trigger_parameter_sync_step <= bound + 1,
             f"{KEY}.trigger_parameter_sync_step",
             f"with a weight push every {a.trigger_parameter_sync_step} updates the rollout's weights lag up to "
             f"{a.trigger_parameter_sync_step - 1} versions, more than the bound of {bound} allows, so the rollout "
             f"would wait forever; use trigger_parameter_sync_step <= {bound + 1} or a larger max_staleness")


def _check_placement(cfg: DictConfig, needs_greedy_baseline: bool) -> None:
    pool = cfg.rollout
    _require(pool.nnodes >= 1 and pool.n_gpus_per_node >= 1, "rollout.n_gpus_per_node",
             "the rollout pool needs nnodes >= 1 and n_gpus_per_node >= 1")
    _require(cfg.trainer.backend == "ray" or pool.nnodes * pool.n_gpus_per_node == 1, "rollout.n_gpus_per_node",
             "the local backend runs the rollout in one child process; set rollout.nnodes=1 "
             "rollout.n_gpus_per_node=1 or use trainer.backend=ray")
    _require(not needs_greedy_baseline, "algorithm.adv_estimator",
             f"algorithm.adv_estimator={cfg.algorithm.adv_estimator} needs a greedy baseline generation per prompt, "
             "which a rollout apart from the actor does not make; use actor_rollout_ref.hybrid_engine=true or "
             "another estimator (grpo, rloo)")
