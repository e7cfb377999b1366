"""The user code a run config names, imported by the driver when the config loads.

``trainer.user_modules`` is rlvr's key for the user's modules: every registry (estimators, losses,
reward managers and workers, scorers, rollout engines, agent loops, tool-call parsers,
environments) sees what they register. verl's ``actor_rollout_ref.model.external_lib`` (and
``critic.model.external_lib``, ``reward_model.model.external_lib``), which verl imports before it builds a model (to register custom
model classes), is honoured too and imported the same way, in the driver and in every worker
process. How an entry is found and how worker processes get it: :mod:`rlvr.utils.user_code`.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, ListConfig

from rlvr.utils.errors import ConfigError
from rlvr.utils.user_code import UserCodeError, absolute_spec, import_user_modules

__all__ = ["import_run_modules", "user_module_entries"]


def _specs(value: Any) -> list[str]:
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, (list, tuple, ListConfig)) else [str(value)]


def user_module_entries(cfg: DictConfig) -> dict[str, list[str]]:
    """Config key -> the module names / files it lists (empty keys left out)."""
    entries = {
        "trainer.user_modules": _specs(cfg.trainer.user_modules),
        "actor_rollout_ref.model.external_lib": _specs(cfg.actor_rollout_ref.model.external_lib),
        "critic.model.external_lib": _specs(cfg.critic.model.external_lib),
        "reward_model.model.external_lib": _specs(cfg.reward_model.model.external_lib),
    }
    return {key: specs for key, specs in entries.items() if specs}


def import_run_modules(cfg: DictConfig) -> None:
    """Import every module the config lists (in the order of :func:`user_module_entries`) and
    record them for the worker processes. Files are written back as absolute paths, so that a
    saved config and the workers find them from any directory.

    Raises:
        ConfigError: naming the key of a module that is missing or fails to import.
    """
    for key, specs in user_module_entries(cfg).items():
        try:
            import_user_modules(specs)
        except UserCodeError as err:
            raise ConfigError(key, str(err)) from None
    cfg.trainer.user_modules = [absolute_spec(spec) for spec in _specs(cfg.trainer.user_modules)]
    for model in (cfg.actor_rollout_ref.model, cfg.critic.model, cfg.reward_model.model):
        if isinstance(model.external_lib, str):
            model.external_lib = absolute_spec(model.external_lib)
        elif model.external_lib is not None:
            model.external_lib = [absolute_spec(spec) for spec in _specs(model.external_lib)]
