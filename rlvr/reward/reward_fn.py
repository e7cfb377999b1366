"""Building and calling the reward function of a run: ``load_reward_manager`` and
``compute_reward`` (verl's trainer API, also at ``rlvr.trainer.ppo.reward``).

``load_reward_manager(config, ...)`` reads ``config.reward_model`` (manager name, error policy,
DAPO buffer, parallel workers) and ``config.custom_reward_function`` (a user ``compute_score``
in a file); ``config`` is the whole run config, an OmegaConf DictConfig, a plain
:class:`~rlvr.trainer.config.schema.RlvrConfig` instance, or a verl config (a dict or OmegaConf
node with verl's keys only: rlvr's own keys then take the schema's defaults).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from rlvr.protocol import DataProto
from rlvr.reward.config import CustomRewardFunctionConfig, RewardManagerSections
from rlvr.utils.config_view import config_view
from rlvr.utils.errors import ConfigError, RewardError
from rlvr.reward.scorers.custom import CustomRewardFunction, load_function
from rlvr.reward.managers import AbstractRewardManager, get_reward_manager_cls
from rlvr.reward.contract import check_token_level_scores


def _plain(value: Any) -> Any:
    """OmegaConf containers as plain python objects; anything else unchanged."""
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, DictConfig) else value


def _name_of(reward_fn: Any) -> str:
    """``reward function 'NaiveRewardManager'`` / ``reward function 'my_fn'`` for messages."""
    return f"reward function {reward_fn.__qualname__ if inspect.isroutine(reward_fn) else type(reward_fn).__name__!r}"


def _custom_section(config: Any) -> CustomRewardFunctionConfig:
    """``config.custom_reward_function`` with the schema's defaults for the keys it lacks."""
    return config_view(config, RewardManagerSections).custom_reward_function


def get_custom_reward_fn(config: Any) -> CustomRewardFunction | None:
    """The scorer named by ``custom_reward_function.path`` / ``.name`` (called with
    ``custom_reward_function.reward_kwargs``), or None when no path is set.

    The file is imported now, so a wrong path or name fails at startup.

    Raises:
        ConfigError: the file is missing, does not import, or lacks the function.
    """
    section = _custom_section(config)
    if section.path is None:
        return None
    name = section.name or "compute_score"  # verl's legacy section leaves the name null
    load_function(section.path, name)
    kwargs = dict(_plain(section.reward_kwargs) or {})
    return CustomRewardFunction(path=str(section.path), name=name, kwargs=kwargs)


def load_reward_manager(config: Any, tokenizer: Any, num_examine: int, **reward_kwargs: Any) -> AbstractRewardManager:
    """Build the reward manager named by ``config.reward_model.reward_manager``.

    Args:
        config: the run config (sections ``reward_model``, ``custom_reward_function``, ``data``).
        tokenizer: decodes prompts and responses.
        num_examine: decoded samples printed per data source per call.
        **reward_kwargs: extra manager arguments; they override ``reward_model.reward_kwargs``.

    Raises:
        ConfigError: unknown manager name (the message lists the registered ones), bad custom function.
    """
    return build_reward_manager(config, config.reward_model.reward_manager, tokenizer, num_examine, **reward_kwargs)


def build_reward_manager(config: Any, name: str, tokenizer: Any, num_examine: int,
                         key: str = "reward_model.reward_manager", **reward_kwargs: Any) -> AbstractRewardManager:
    """The reward manager registered as ``name``, configured from ``config.reward_model`` and
    ``config.custom_reward_function`` (``key``: the config key that named it, for errors). A
    verl-shaped ``config`` that lacks rlvr's keys (``on_error``, ``num_workers``, ...) gets the
    schema's defaults for them."""
    config = config_view(config, RewardManagerSections)
    try:
        manager_cls = get_reward_manager_cls(name)
    except KeyError as exc:
        raise ConfigError(key, str(exc.args[0])) from exc
    kwargs = {**dict(_plain(config.reward_model.reward_kwargs) or {}), **reward_kwargs}
    return manager_cls.from_config(config, tokenizer, num_examine, get_custom_reward_fn(config), **kwargs)


def compute_reward(data: DataProto, reward_fn: AbstractRewardManager) -> tuple[torch.Tensor, dict[str, Any]]:
    """Score a batch: ``(token_level_scores [batch, response_len], reward_extra_info)``.

    ``reward_extra_info`` maps a name to a per-sample list (length batch). The manager's
    per-data-source metrics (``reward/<source>/...``) are added to ``data.meta_info["metrics"]``.

    Raises:
        RewardError: the reward function broke its contract (shape, dtype, non-finite values).
    """
    result = reward_fn(data, return_dict=True)
    if not isinstance(result, dict) or "reward_tensor" not in result:
        raise RewardError(
            f"{_name_of(reward_fn)} returned {type(result).__name__}; with return_dict=True "
            "it must return a dict with 'reward_tensor' (and optionally 'reward_extra_info', 'reward_metrics')"
        )
    batch_size, response_len = data.batch["responses"].shape
    reward_tensor = check_token_level_scores(result["reward_tensor"], batch_size, response_len, _name_of(reward_fn))
    extra_info = dict(result.get("reward_extra_info", {}))
    for key, values in extra_info.items():
        if len(values) != batch_size:
            raise RewardError(
                f"{_name_of(reward_fn)} returned reward_extra_info[{key!r}] with {len(values)} entries "
                f"for a batch of {batch_size}; every entry must be a per-sample list"
            )
    data.meta_info.setdefault("metrics", {}).update(result.get("reward_metrics", {}))
    return reward_tensor, extra_info
