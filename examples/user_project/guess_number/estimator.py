"""The ``group_median`` advantage estimator."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

from rlvr.trainer.ppo.advantage import register_adv_est


@register_adv_est("group_median", needs_groups=True)
def compute_group_median_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any,
                                   config: Any = None, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Outcome advantage against the median score of the prompt's samples:
    ``A_i = s_i - median_g(s)`` with ``s_i = sum_t token_level_rewards[i, t]`` (one lucky sample
    does not move the baseline as it moves a mean; for an even group the lower of the two middle
    scores). A sample alone in its group gets 0. Broadcast over the response, ``[batch, response_len]``.
    """
    scores = token_level_rewards.float().sum(-1)
    advantages = torch.zeros_like(scores)
    groups: dict[Any, list[int]] = defaultdict(list)
    for row, uid in enumerate(index):
        groups[uid].append(row)
    for rows in groups.values():
        if len(rows) > 1:
            advantages[rows] = scores[rows] - scores[rows].median()
    advantages = advantages.unsqueeze(-1) * response_mask.float()
    return advantages, advantages
