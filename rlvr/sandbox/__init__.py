"""Isolated execution of untrusted generated code (see :mod:`rlvr.sandbox.local` for the layers)."""

from rlvr.sandbox.config import SandboxConfig, SandboxResult
from rlvr.sandbox.http import HttpSandboxClient, make_server, start_background_server
from rlvr.sandbox.local import LocalSandbox, SandboxJob

__all__ = [
    "HttpSandboxClient",
    "LocalSandbox",
    "SandboxConfig",
    "SandboxJob",
    "SandboxResult",
    "make_server",
    "start_background_server",
]
