"""The names rlvr's registries hold out of the box, known without importing them.

Why a copy: the registries live beside their torch code, and importing them takes seconds, but
the ``rlvr`` command checks a config before it pays for torch. So it checks the config's
registry-backed values against :data:`BUILTIN_NAMES` (with
:func:`~rlvr.trainer.config.validate.check_names`), and what a built-in advantage estimator needs
against :data:`BUILTIN_ESTIMATOR_NEEDS` (a copy of the ``needs_*`` flags of each estimator's
``@register_adv_est``), so that a misspelt estimator or a GAE run without a critic fails at once.
The trainer validates against the registries themselves, which also hold names (and needs)
registered from Python. ``tests/trainer/test_main_ppo.py::test_builtin_names_match_the_registries``
keeps both tables equal to the registries: every name, and every estimator's needs flags.
"""

from __future__ import annotations

from dataclasses import dataclass

_TOKEN_KL = ("abs", "abs+", "k1", "k1+", "k2", "k2+", "k3", "k3+", "kl", "kl+", "low_var_kl", "low_var_kl+",
             "mse", "mse+")
_RATIO_LEVELS = ("geometric", "sequence", "token")


@dataclass(frozen=True)
class AdvantageEstimatorNeeds:
    """What an estimator needs from the trainer (the metadata of its registry entry)."""

    needs_critic: bool = False
    """values from a critic: ``critic.enable`` defaults to it and validation requires it."""
    needs_groups: bool = False
    """several samples per prompt to compare: validation requires ``rollout.n > 1``."""
    needs_greedy_baseline: bool = False
    """the reward of a greedy response per prompt: the trainer generates and scores one and passes
    it as ``reward_baselines``."""
    reads_old_log_prob: bool = False
    """reads ``old_log_prob`` (the actor's log-probs before the update): an asynchronous run then
    recomputes them before the advantages instead of taking them from the update's forward pass."""
    needs_sum_pi_squared: bool = False
    """reads ``sum_pi_squared`` (``sum_v pi(v)^2`` per token, from the actor's old-log-prob pass):
    validation requires ``actor.calculate_sum_pi_squared=true``."""


EstimatorNeeds = AdvantageEstimatorNeeds

_GROUPS = AdvantageEstimatorNeeds(needs_groups=True)
_TOKEN_BASELINE = AdvantageEstimatorNeeds(needs_groups=True, reads_old_log_prob=True, needs_sum_pi_squared=True)
BUILTIN_ESTIMATOR_NEEDS: dict[str, AdvantageEstimatorNeeds] = {
    "egpo": AdvantageEstimatorNeeds(needs_groups=True, reads_old_log_prob=True),
    "gae": AdvantageEstimatorNeeds(needs_critic=True),
    "gdpo": _GROUPS,
    "gpg": _GROUPS,
    "grpo": _GROUPS,
    "grpo_passk": _GROUPS,
    "grpo_vectorized": _GROUPS,
    "opo": _GROUPS,
    "optimal_token_baseline": _TOKEN_BASELINE,
    "reinforce_plus_plus": AdvantageEstimatorNeeds(),
    "reinforce_plus_plus_baseline": _GROUPS,
    "remax": AdvantageEstimatorNeeds(needs_greedy_baseline=True),
    "rloo": _GROUPS,
    "rloo_vectorized": _GROUPS,
    "tir_optimal_token_baseline": _TOKEN_BASELINE,
}

BUILTIN_NAMES: dict[str, tuple[str, ...]] = {
    "algorithm.adv_estimator": tuple(BUILTIN_ESTIMATOR_NEEDS),
    "actor_rollout_ref.actor.policy_loss.loss_mode": ("bypass_mode", "cispo", "clip_cov", "dppo_kl", "dppo_tv", "dro",
                                                      "geo_mean", "gpg", "gspo", "kl_cov", "sapo", "vanilla"),
    "actor_rollout_ref.rollout.name": ("hf", "vllm"),
    "reward_model.reward_manager": ("batch", "dapo", "naive", "parallel"),
    "actor_rollout_ref.actor.kl_loss_type": _TOKEN_KL,
    "algorithm.kl_penalty": _TOKEN_KL,
    "algorithm.rollout_correction.rollout_is": _RATIO_LEVELS,
    "algorithm.rollout_correction.rollout_rs": _RATIO_LEVELS,
    "actor_rollout_ref.rollout.agent.default_agent_loop": ("env_agent", "openai_agent", "single_turn", "single_turn_agent",
                                                           "tool_agent"),
    "actor_rollout_ref.rollout.multi_turn.format": ("hermes",),
    "actor_rollout_ref.rollout.multi_turn.env_name": ("retry",),
    "distillation.distillation_loss.loss_mode": ("abs", "forward_kl_topk", "k1", "k2", "k3", "kl", "low_var_kl", "mse"),
}

NULLABLE_NAMES = frozenset({"algorithm.rollout_correction.rollout_is", "algorithm.rollout_correction.rollout_rs",
                            "actor_rollout_ref.rollout.multi_turn.env_name"})
"""Registry-backed keys whose null means "off"."""
