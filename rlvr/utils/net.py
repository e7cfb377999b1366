"""Network helpers of the servers rlvr starts or talks to: loopback checks, free ports, and the
rule that nothing listens beyond loopback without an API key.

A vLLM server in dev mode (``VLLM_SERVER_DEV_MODE=1``, which the weight sync needs) exposes
``/collective_rpc``, which runs any method of its workers: reachable from the network without a key,
it is a remote shell. So rlvr binds its managed replicas and its own OpenAI-compatible endpoint to
127.0.0.1 unless the config says otherwise, and refuses to bind them anywhere else without a key.
(No torch import here: config validation uses it before anything heavy loads.)
"""

from __future__ import annotations

import ipaddress
import socket

from rlvr.utils.errors import ConfigError

__all__ = ["is_loopback", "free_port", "require_key_off_loopback"]


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) resolves to loopback addresses only."""
    try:
        infos = socket.getaddrinfo(host, None)
    except socket.gaierror:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


def free_port(host: str) -> int:
    """A TCP port free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def require_key_off_loopback(host: str, api_key: str | None, key_path: str, what: str) -> None:
    """Refuse to serve ``what`` on a non-loopback ``host`` without an API key.

    Raises:
        ConfigError: at ``key_path`` (the api_key setting), saying why and what to set.
    """
    if not is_loopback(host) and not api_key:
        raise ConfigError(key_path, f"{what} would listen on {host!r}, which other machines may reach, without an "
                                    "API key; set an api_key (clients then send 'Authorization: Bearer <key>') or "
                                    "bind to 127.0.0.1")
