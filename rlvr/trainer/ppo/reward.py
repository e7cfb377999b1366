"""``compute_reward`` and ``load_reward_manager`` at verl's module path; they live in
:mod:`rlvr.reward.reward_fn` (see :mod:`rlvr.reward.legacy_paths`)."""

from rlvr.reward.reward_fn import compute_reward, get_custom_reward_fn, load_reward_manager

__all__ = ["compute_reward", "get_custom_reward_fn", "load_reward_manager"]
