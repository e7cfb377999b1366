"""Checks of the settings the estimators and losses of verl 0.9.1 added (torch-free).

- An estimator that reads ``sum_pi_squared`` (its registry entry's ``needs_sum_pi_squared``:
  ``optimal_token_baseline``, ``tir_optimal_token_baseline``) needs
  ``actor.calculate_sum_pi_squared=true``; that pass is the actor's old-log-prob pass, which bypass
  mode skips.
- GDPO's reward keys and weights; the keys are read by ``gdpo`` only.
- The loss knobs: ``dro`` needs ``policy_loss.dro_beta > 0``, ``sapo`` positive temperatures;
  ``bypass_mode`` is what verl switches the loss to for ``algorithm.rollout_correction.bypass_mode``,
  which rlvr applies with any loss.
"""

from __future__ import annotations

from omegaconf import DictConfig

from rlvr.trainer.config.builtin_names import EstimatorNeeds
from rlvr.utils.errors import ConfigError

__all__ = ["check_new_algorithm_settings"]

_ACTOR = "actor_rollout_ref.actor"


def _require(condition: bool, key: str, message: str) -> None:
    if not condition:
        raise ConfigError(key, message)


def _check_sum_pi_squared(cfg: DictConfig, needs: EstimatorNeeds | None) -> None:
    actor, algo = cfg.actor_rollout_ref.actor, cfg.algorithm
    _require(needs is None or not needs.needs_sum_pi_squared or actor.calculate_sum_pi_squared,
             f"{_ACTOR}.calculate_sum_pi_squared",
             f"algorithm.adv_estimator={algo.adv_estimator} weighs each token by sum_v pi(v)^2 from the actor's "
             "old-log-prob pass; set actor_rollout_ref.actor.calculate_sum_pi_squared=true")
    _require(not (actor.calculate_sum_pi_squared and algo.rollout_correction.bypass_mode),
             f"{_ACTOR}.calculate_sum_pi_squared",
             "sum_pi_squared comes from the actor's old-log-prob pass, which "
             "algorithm.rollout_correction.bypass_mode=true skips (the rollout's log-probs are the old ones); "
             "turn one of them off")


def _check_gdpo(cfg: DictConfig) -> None:
    algo = cfg.algorithm
    keys, weights = algo.gdpo_reward_keys, algo.gdpo_reward_weights
    if algo.adv_estimator == "gdpo":
        _require(bool(keys), "algorithm.gdpo_reward_keys",
                 "GDPO normalises each reward component on its own: list the keys of your reward function's "
                 "compute_score dict, e.g. algorithm.gdpo_reward_keys=[format_reward,accuracy_reward]")
    else:
        _require(keys is None and weights is None, "algorithm.gdpo_reward_keys",
                 f"is read by the gdpo estimator only, not by {algo.adv_estimator}; remove it or set "
                 "algorithm.adv_estimator=gdpo")
    if keys and weights is not None:
        _require(len(weights) == len(keys), "algorithm.gdpo_reward_weights",
                 f"{len(weights)} weights for {len(keys)} reward keys; give one weight per key")


def _check_losses(cfg: DictConfig) -> None:
    actor = cfg.actor_rollout_ref.actor
    mode = actor.policy_loss.loss_mode
    beta = actor.policy_loss.dro_beta
    _require(mode != "dro" or (beta is not None and beta > 0), f"{_ACTOR}.policy_loss.dro_beta",
             f"the dro loss penalises 0.5 * beta * (log-ratio)^2 and needs beta > 0, got {beta}; set it (e.g. 0.1)")
    for key in ("tau_pos", "tau_neg"):
        _require(actor[key] > 0, f"{_ACTOR}.{key}", f"the SAPO gate temperature must be > 0, got {actor[key]}")
    _require(mode != "bypass_mode", f"{_ACTOR}.policy_loss.loss_mode",
             "bypass_mode is the loss verl switches to when algorithm.rollout_correction.bypass_mode=true; in rlvr "
             "set that key instead (the rollout's log-probs become the old ones and the rejection runs in the actor, "
             "with the loss_mode you choose: vanilla gives verl's ppo_clip numbers)")


def check_new_algorithm_settings(cfg: DictConfig, needs: EstimatorNeeds | None) -> None:
    """Raise :class:`ConfigError` for the first problem in the settings of the module docstring.
    ``needs`` is what the estimator's registry entry says it needs (None: unknown yet)."""
    _check_sum_pi_squared(cfg, needs)
    _check_gdpo(cfg)
    _check_losses(cfg)
