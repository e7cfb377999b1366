"""The names rlvr's registries hold out of the box, known without importing them.

The registries live beside their torch code, and importing them takes seconds; the ``rlvr``
command checks a config's registry-backed values against this table first (with
:func:`~rlvr.trainer.config.validate.check_names`), so that a misspelt estimator fails at once.
The trainer validates against the registries themselves, which also hold names registered from
Python. ``tests/trainer/test_config.py`` checks that this table equals the registries' contents.
"""

from __future__ import annotations

_TOKEN_KL = ("abs", "abs+", "k1", "k1+", "k2", "k2+", "k3", "k3+", "kl", "kl+", "low_var_kl", "low_var_kl+",
             "mse", "mse+")

BUILTIN_NAMES: dict[str, tuple[str, ...]] = {
    "algorithm.adv_estimator": ("egpo", "gae", "gpg", "grpo", "opo", "reinforce_plus_plus",
                                "reinforce_plus_plus_baseline", "remax", "rloo"),
    "actor_rollout_ref.actor.policy_loss.loss_mode": ("cispo", "clip_cov", "geo_mean", "gpg", "gspo", "kl_cov",
                                                      "vanilla"),
    "actor_rollout_ref.rollout.name": ("hf",),
    "reward_model.reward_manager": ("batch", "dapo", "naive", "parallel"),
    "actor_rollout_ref.actor.kl_loss_type": _TOKEN_KL,
    "algorithm.kl_penalty": _TOKEN_KL,
}
