"""The reward managers at verl's module path; they live in :mod:`rlvr.reward.managers` (see
:mod:`rlvr.reward.legacy_paths`)."""

import sys

from rlvr.reward import managers as _package
from rlvr.reward.legacy_paths import alias_submodules
from rlvr.reward.managers import *  # noqa: F403 - this path re-exports the package's API
from rlvr.reward.router import RewardRouter

__all__ = [*_package.__all__, "RewardRouter"]

_MANAGER_MODULES = ("base", "batch", "dapo", "naive", "parallel", "registry")
alias_submodules(sys.modules[__name__], {
    **{name: f"rlvr.reward.managers.{name}" for name in _MANAGER_MODULES},
    "abstract": "rlvr.reward.managers.base",  # verl's module of AbstractRewardManager
    "router": "rlvr.reward.router",
    "contract": "rlvr.reward.contract",
})
