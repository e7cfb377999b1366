"""DAPO's reward manager: the rule score plus the overlong-buffer length penalty.

DAPO (Yu et al., 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
section 3.4 "Overlong Reward Shaping"): with ``L_max = max_resp_len`` and a buffer of
``L_cache = overlong_buffer.len`` tokens, a response of ``L`` valid tokens gets::

    penalty = min(-(L - (L_max - L_cache)) / L_cache * penalty_factor, 0)

i.e. 0 up to ``L_max - L_cache`` tokens, ramping linearly to ``-penalty_factor`` at ``L_max``.
Metrics: ``reward/overlong/mean_penalty`` and ``reward/overlong/frac`` (share of penalised
samples); with ``overlong_buffer.log`` also per-sample ``overlong_reward`` / ``overlong``.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import torch

from rlvr.reward.config import OverlongBufferConfig
from rlvr.reward.decode import DecodedBatch
from rlvr.reward.managers.base import RewardBook, RewardConfigError
from rlvr.reward.managers.naive import NaiveRewardManager
from rlvr.reward.managers.registry import register
from rlvr.utils.config_view import config_view


def overlong_config(cfg: Any) -> OverlongBufferConfig:
    """Accept an :class:`OverlongBufferConfig`, an OmegaConf section, a dict, a namespace (a
    missing field takes its default) or None (disabled)."""
    view = config_view(cfg, OverlongBufferConfig)
    return OverlongBufferConfig(**{field.name: getattr(view, field.name) for field in fields(OverlongBufferConfig)})


def overlong_penalty(response_length: torch.Tensor, max_resp_len: int, buffer_len: int, penalty_factor: float) -> torch.Tensor:
    """``[batch]`` DAPO penalty (<= 0) for ``response_length [batch]`` valid tokens."""
    exceed = response_length.float() - (max_resp_len - buffer_len)
    return torch.clamp(-exceed / buffer_len * penalty_factor, max=0.0)


@register("dapo")
class DAPORewardManager(NaiveRewardManager):
    """:class:`NaiveRewardManager` plus the overlong penalty on scored samples.

    The other arguments, ``compute_score_timeout`` and the keyword-only ones included, are those of
    :class:`NaiveRewardManager`.

    Args:
        max_resp_len: ``L_max``, the rollout's maximum response length (required when the buffer is on).
        overlong_buffer_cfg: ``enable``, ``len``, ``penalty_factor``, ``log`` (see the schema).
    """

    def __init__(self, tokenizer: Any, num_examine: int, compute_score: Any = None, reward_fn_key: str = "data_source",
                 max_resp_len: int | None = None, overlong_buffer_cfg: Any = None, **kwargs: Any) -> None:
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key, **kwargs)
        self.max_resp_len = max_resp_len
        self.overlong = overlong_config(overlong_buffer_cfg)
        if self.overlong.enable:
            if max_resp_len is None:
                raise RewardConfigError("reward_model.overlong_buffer",
                                        "max_resp_len must be provided when the overlong buffer is enabled, but got "
                                        "None; pass the rollout's maximum response length (data.max_response_length)")
            if not self.overlong.len > 0:
                raise RewardConfigError("reward_model.overlong_buffer.len",
                                        f"the buffer must be > 0 tokens long, got {self.overlong.len}")
            if max_resp_len < self.overlong.len:
                raise RewardConfigError("reward_model.overlong_buffer.len",
                                        f"max_resp_len must be larger than overlong_buffer.len: the buffer of "
                                        f"{self.overlong.len} tokens does not fit in max_resp_len={max_resp_len}")

    @classmethod
    def config_kwargs(cls, config: Any) -> dict[str, Any]:
        return {
            "max_resp_len": config.data.max_response_length,
            "overlong_buffer_cfg": config.reward_model.overlong_buffer,
        }

    def _score(self, decoded: DecodedBatch, book: RewardBook) -> dict[str, float]:
        """The rule score of each sample plus the overlong penalty (score + penalty on the last valid token)."""
        metrics = super()._score(decoded, book)
        if self.overlong.enable:
            penalty = overlong_penalty(
                decoded.response_length, self.max_resp_len, self.overlong.len, self.overlong.penalty_factor
            )
            scored = [i for i, status in enumerate(book.status) if status == "ok"]
            for i in scored:
                extras = {"overlong_reward": float(penalty[i]), "overlong": bool(penalty[i] < 0)} if self.overlong.log else {}
                book.add(i, float(penalty[i]), extras)
            if scored:
                metrics["reward/overlong/mean_penalty"] = float(penalty[scored].mean())
                metrics["reward/overlong/frac"] = float((penalty[scored] < 0).float().mean())
        return metrics
