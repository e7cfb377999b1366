"""The reward workers at their documented path; they live in :mod:`rlvr.reward.workers` (see
:mod:`rlvr.reward.legacy_paths`)."""

import sys

from rlvr.reward import workers as _package
from rlvr.reward.legacy_paths import alias_submodules
from rlvr.reward.workers import *  # noqa: F403 - this path re-exports the package's API

__all__ = list(_package.__all__)

_SUBMODULES = ("base", "code_sandbox", "detection", "ifeval_rule", "llm_judge", "math_rule", "qa_rule", "registry")
alias_submodules(sys.modules[__name__], {name: f"rlvr.reward.workers.{name}" for name in _SUBMODULES})
