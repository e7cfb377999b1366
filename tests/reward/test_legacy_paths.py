"""The reward API at verl's module paths is the code in rlvr.reward: the same objects, submodules
included, so registries and patched attributes are shared."""

from __future__ import annotations

import importlib

import pytest

ALIASES = {
    "rlvr.utils.reward_score.gsm8k": "rlvr.reward.scorers.gsm8k",
    "rlvr.utils.reward_score.math": "rlvr.reward.scorers.math",
    "rlvr.utils.reward_score.ifeval": "rlvr.reward.scorers.ifeval",
    "rlvr.utils.reward_score.registry": "rlvr.reward.scorers.registry",
    "rlvr.workers.reward_manager.naive": "rlvr.reward.managers.naive",
    "rlvr.workers.reward_manager.dapo": "rlvr.reward.managers.dapo",
    "rlvr.workers.reward_manager.registry": "rlvr.reward.managers.registry",
    "rlvr.workers.reward_manager.abstract": "rlvr.reward.managers.base",
    "rlvr.workers.reward_manager.router": "rlvr.reward.router",
    "rlvr.workers.reward.math_rule": "rlvr.reward.workers.math_rule",
    "rlvr.workers.reward.base": "rlvr.reward.workers.base",
}


@pytest.mark.parametrize("old", sorted(ALIASES))
def test_old_module_path_is_the_new_module(old):
    assert importlib.import_module(old) is importlib.import_module(ALIASES[old])


def test_package_names_are_the_same_objects():
    import rlvr.reward.managers as managers
    import rlvr.reward.reward_fn as reward_fn
    import rlvr.reward.scorers as scorers
    import rlvr.reward.workers as workers
    from rlvr.trainer.ppo import reward as trainer_reward
    from rlvr.utils import reward_score
    from rlvr.workers import reward as worker_path
    from rlvr.workers import reward_manager

    assert reward_score.default_compute_score is scorers.default_compute_score
    assert reward_score._default_compute_score is scorers.default_compute_score  # verl's earlier name
    assert reward_score.SCORER_REGISTRY is scorers.SCORER_REGISTRY
    assert reward_manager.NaiveRewardManager is managers.NaiveRewardManager
    assert reward_manager.REWARD_MANAGER_REGISTRY is managers.REWARD_MANAGER_REGISTRY
    assert worker_path.MathRuleRewardWorker is workers.MathRuleRewardWorker
    assert trainer_reward.compute_reward is reward_fn.compute_reward
    assert trainer_reward.load_reward_manager is reward_fn.load_reward_manager
    from rlvr.utils.reward_score import gsm8k

    assert gsm8k.compute_score("#### 72", "72") == 1.0
