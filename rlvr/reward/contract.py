"""Output checks for everything that produces rewards (managers, routes, reward workers).

Each check raises :class:`RewardError` naming the producer (``source``), the offending key, and
what was expected, so a broken plug-in fails at the step that produced the bad value instead of
as a NaN loss later.
"""

from __future__ import annotations

from typing import Any

import torch

from rlvr.protocol import DataProto
from rlvr.utils.errors import RewardError

WORKER_OUTPUT_KEYS = ("token_level_rewards", "response_level_rewards", "scores")
ACC_THRESHOLD = 1.0
"""Without an ``acc`` from the reward function, a sample counts as correct when its score is >= 1."""


def _check_tensor(value: Any, shape: tuple[int, ...], source: str, key: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise RewardError(f"{source} produced {key} of type {type(value).__name__}; expected a torch.Tensor")
    if tuple(value.shape) != shape:
        dims = "[batch, response_len]" if len(shape) == 2 else "[batch]"
        raise RewardError(
            f"{source} produced {key} of shape {list(value.shape)}; expected {dims} = {list(shape)}"
        )
    if not value.is_floating_point():
        raise RewardError(f"{source} produced {key} with dtype {value.dtype}; expected a floating-point tensor")
    finite = torch.isfinite(value)
    if not bool(finite.all()):
        bad = (~finite).nonzero()[0].tolist()
        raise RewardError(
            f"{source} produced a non-finite {key} value {value[tuple(bad)].item()} at index {bad}; "
            "scores must be finite numbers"
        )
    return value


def check_token_level_scores(value: Any, batch_size: int, response_len: int, source: str) -> torch.Tensor:
    """``value`` must be a finite float tensor ``[batch, response_len]``."""
    return _check_tensor(value, (batch_size, response_len), source, "token_level_scores")


def check_response_scores(value: Any, batch_size: int, source: str, key: str = "scores") -> torch.Tensor:
    """``value`` must be a finite float tensor ``[batch]``."""
    return _check_tensor(value, (batch_size,), source, key)


def check_worker_output(output: Any, batch_size: int, response_len: int, source: str) -> dict[str, torch.Tensor]:
    """A reward worker's ``compute_rewards`` result: a DataProto with ``token_level_rewards
    [batch, response_len]``, ``response_level_rewards [batch]`` and ``scores [batch]``, all
    finite floats. Returns the three tensors as float32."""
    if not isinstance(output, DataProto) or output.batch is None:
        raise RewardError(
            f"{source} returned {type(output).__name__} from compute_rewards; expected a DataProto with "
            f"tensors {', '.join(WORKER_OUTPUT_KEYS)}"
        )
    missing = [key for key in WORKER_OUTPUT_KEYS if key not in output.batch.keys()]
    if missing:
        raise RewardError(f"{source} returned a DataProto without {missing} (has: {sorted(output.batch.keys())})")
    tensors = {
        "token_level_rewards": _check_tensor(
            output.batch["token_level_rewards"], (batch_size, response_len), source, "token_level_rewards"
        ),
        "response_level_rewards": check_response_scores(
            output.batch["response_level_rewards"], batch_size, source, "response_level_rewards"
        ),
        "scores": check_response_scores(output.batch["scores"], batch_size, source, "scores"),
    }
    return {key: value.float() for key, value in tensors.items()}
