"""Typed run configuration: schema, presets, loading with overrides, validation.

The schema's sections are the only config types: a policy loss takes the actor section
(``ActorConfig``, whose ``policy_loss`` is a ``PolicyLossConfig``), an advantage estimator the
algorithm section (``AlgorithmConfig``, also under verl's name ``AlgoConfig``), the KL controller
``algorithm.kl_ctrl`` (``KLControlConfig``).
"""

from rlvr.trainer.config.loader import finalize_config, help_config, list_presets, load_config, to_config
from rlvr.trainer.config.schema import (
    ActorConfig,
    AlgorithmConfig,
    CriticConfig,
    FilterGroupsConfig,
    KLControlConfig,
    PolicyLossConfig,
    RlvrConfig,
)
from rlvr.trainer.config.validate import check_config, check_names, use_reference, validate_config, world_size

AlgoConfig = AlgorithmConfig
"""verl's name of the algorithm section."""

__all__ = [
    "ActorConfig",
    "AlgoConfig",
    "AlgorithmConfig",
    "CriticConfig",
    "FilterGroupsConfig",
    "KLControlConfig",
    "PolicyLossConfig",
    "RlvrConfig",
    "check_config",
    "check_names",
    "finalize_config",
    "help_config",
    "list_presets",
    "load_config",
    "to_config",
    "use_reference",
    "validate_config",
    "world_size",
]
