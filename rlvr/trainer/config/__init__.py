"""Typed run configuration: schema, presets, loading with overrides, validation."""

from rlvr.trainer.config.loader import finalize_config, help_config, list_presets, load_config, to_config
from rlvr.trainer.config.schema import RlvrConfig
from rlvr.trainer.config.validate import check_config, check_names, use_reference, validate_config, world_size

__all__ = [
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
