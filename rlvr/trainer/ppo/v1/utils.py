"""verl's ``verl.trainer.ppo.v1.utils``: the advantage of agent sessions made of several trajectories.

An agent loop may answer one prompt with several model outputs per session (a rollout that is cut
and continued, sub-agents). With GRPO the session is judged by its last output: the group baseline is
taken over the last outputs of the prompt's sessions, and every output of a session gets its last
output's advantage (on its own response tokens).
"""

from __future__ import annotations

from typing import Any

import torch

from rlvr.protocol import DataProto
from rlvr.trainer.ppo.advantage import estimator_name
from rlvr.trainer.ppo.batch_steps import compute_advantage
from rlvr.utils.errors import ProtocolError

__all__ = ["compute_advantage", "compute_advantage_for_multi_trajectories"]


def _last_output_of_each_session(batch_keys: list[str]) -> tuple[list[int], list[int]]:
    """``(rows of the last output of each session, each row's session number)`` from keys
    ``<uid>_<session_id>_<index>`` (the output with the largest index is the session's last)."""
    last: dict[str, tuple[int, int]] = {}
    sessions: list[str] = []
    for row, key in enumerate(batch_keys):
        parts = key.rsplit("_", 2)
        if len(parts) != 3 or not parts[2].lstrip("-").isdigit():
            raise ProtocolError(f"batch key {key!r} is not <uid>_<session_id>_<index>")
        session, index = f"{parts[0]}_{parts[1]}", int(parts[2])
        sessions.append(session)
        if session not in last or last[session][0] < index:
            last[session] = (index, row)
    order = {session: i for i, session in enumerate(last)}
    return [row for _, row in last.values()], [order[session] for session in sessions]


def compute_advantage_for_multi_trajectories(data: DataProto, batch_keys: list[str], adv_estimator: Any,
                                             gamma: float = 1.0, lam: float = 1.0, num_repeat: int = 1,
                                             norm_adv_by_std_in_grpo: bool = True, config: Any = None) -> DataProto:
    """GRPO over the last output of each session, broadcast to the session's outputs (see the module
    docstring); ``advantages`` = ``returns`` = that scalar on each row's response tokens. Other
    estimators: :func:`compute_advantage` on the rows as they are.

    Args:
        data: ``[rows]`` with ``token_level_rewards``, ``response_mask`` and ``uid``.
        batch_keys: ``<uid>_<session_id>_<index>`` of each row.
    """
    if estimator_name(adv_estimator) != "grpo":
        return compute_advantage(data, adv_estimator, gamma=gamma, lam=lam, num_repeat=num_repeat,
                                 norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo, config=config)
    if len(batch_keys) != len(data):
        raise ProtocolError(f"{len(batch_keys)} batch keys for {len(data)} rows; give one per row")
    last_rows, session_of_row = _last_output_of_each_session(batch_keys)
    finals = compute_advantage(data.select_idxs(last_rows), adv_estimator, gamma=gamma, lam=lam,
                               num_repeat=num_repeat, norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo, config=config)
    first_token = finals.batch["response_mask"].argmax(dim=1)  # the sequence advantage sits on every valid token
    per_session = finals.batch["advantages"][torch.arange(len(finals)), first_token]  # [sessions]
    advantages = per_session[session_of_row].unsqueeze(-1) * data.batch["response_mask"]
    data.batch["advantages"], data.batch["returns"] = advantages, advantages
    return data
