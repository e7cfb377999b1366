"""The field maker of rlvr's config dataclasses (torch-free: loading a config imports no torch)."""

from __future__ import annotations

from dataclasses import field
from typing import Any

__all__ = ["config_field"]


def config_field(default: Any, help: str) -> Any:  # noqa: A002 - "help" is the metadata key the schema documents
    """A dataclass field with a default (a list or dict default is copied for every instance) and the
    help string that ``gen_config_reference`` and ``rlvr config --help`` print."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata={"help": help})
    return field(default=default, metadata={"help": help})
