"""The rule scorers at verl's module path; they live in :mod:`rlvr.reward.scorers` (see
:mod:`rlvr.reward.legacy_paths`)."""

import sys

from rlvr.reward import scorers as _package
from rlvr.reward.legacy_paths import alias_submodules
from rlvr.reward.scorers import *  # noqa: F403 - this path re-exports the package's API

__all__ = list(_package.__all__)
_default_compute_score = _package.default_compute_score  # verl's earlier name of default_compute_score

_SUBMODULES = ("code", "countdown", "custom", "detection", "gsm8k", "ifeval", "judge", "math", "multiple_choice",
               "process_pool", "reasoning_gym", "registry", "text")
alias_submodules(sys.modules[__name__], {name: f"rlvr.reward.scorers.{name}" for name in _SUBMODULES})
