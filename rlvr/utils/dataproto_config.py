"""Padding settings of every :class:`rlvr.protocol.DataProto` (verl's ``DataProtoConfig``).

Auto padding (off by default, as in verl) lets a DataProto be chunked into parts of unequal length
and pads it at dispatch: ``DataProtoConfig.auto_padding = True``, ``RLVR_AUTO_PADDING=1``, the
``with auto_padding():`` block, or ``DataProto.from_dict(..., auto_padding=True)`` for one record.
``DataProtoConfig.dispatch_padding`` (rlvr, on by default) pads dispatched DataProtos even without
auto padding; turn it off to get verl's error for a batch that does not divide the world size.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from rlvr.utils.errors import ProtocolTypeError

__all__ = ["DataProtoConfig", "auto_padding"]


class _DataProtoConfigMeta(type):
    """Process-wide padding switches, set as class attributes: ``DataProtoConfig.auto_padding = True``."""

    @property
    def auto_padding(cls) -> bool:
        """Every DataProto may be chunked unevenly and is padded at dispatch (verl's auto padding);
        also on when the environment has ``RLVR_AUTO_PADDING=1`` (or ``true``)."""
        from_env = os.environ.get("RLVR_AUTO_PADDING", "false").strip().lower() in ("1", "true")
        return from_env or cls._auto_padding

    @auto_padding.setter
    def auto_padding(cls, enabled: bool) -> None:
        if not isinstance(enabled, bool):
            raise ProtocolTypeError(f"DataProtoConfig.auto_padding must be a bool, got {enabled!r}")
        cls._auto_padding = enabled

    @property
    def dispatch_padding(cls) -> bool:
        """rlvr: a DataProto dispatched to a worker group is padded to a multiple of the number of
        chunks even without auto padding (True, the default). False: only with auto padding, as in
        verl, where other lengths that do not divide raise."""
        return cls._dispatch_padding

    @dispatch_padding.setter
    def dispatch_padding(cls, enabled: bool) -> None:
        if not isinstance(enabled, bool):
            raise ProtocolTypeError(f"DataProtoConfig.dispatch_padding must be a bool, got {enabled!r}")
        cls._dispatch_padding = enabled


class DataProtoConfig(metaclass=_DataProtoConfigMeta):
    """Padding settings of all DataProtos (see ``auto_padding`` and ``dispatch_padding`` above).

    ``meta_info[DataProtoConfig.auto_padding_key] = True`` turns auto padding on for one DataProto
    (``DataProto.from_dict(..., auto_padding=True)`` sets it).
    """

    auto_padding_key = "_rlvr_auto_padding"
    _auto_padding = False
    _dispatch_padding = True


@contextmanager
def auto_padding(enabled: bool = True) -> Iterator[None]:
    """Turn ``DataProtoConfig.auto_padding`` on (or off) inside a ``with`` block, restoring it after."""
    saved = DataProtoConfig._auto_padding
    DataProtoConfig.auto_padding = enabled
    try:
        yield
    finally:
        DataProtoConfig.auto_padding = saved
