"""Network helpers of the servers rlvr starts or talks to: loopback checks, free ports, and the
rule that nothing listens beyond loopback without an API key.

A vLLM server in dev mode (``VLLM_SERVER_DEV_MODE=1``, which the weight sync needs) exposes
``/collective_rpc``, which runs any method of its workers: reachable from the network, it is a remote
shell. vLLM's ``--api-key`` does not close it: in vLLM 0.32 the key guards only the paths that start
with ``/v1``, ``/v2``, ``/inference`` and ``/cohere``, so ``/collective_rpc``, ``/pause``,
``/update_weight_version`` and the other dev and RL routes answer anyone (checked against the real
server in ``tests/workers/rollout/test_vllm_server.py``). So rlvr starts managed replicas on loopback
only (:func:`require_loopback_for_dev_mode`), sends the key to every replica, and binds its own
OpenAI-compatible endpoint, which checks the key on every route, anywhere else only with a key
(:func:`require_key_off_loopback`). (No torch import here: config validation uses it first.)
"""

from __future__ import annotations

import ipaddress
import socket

from rlvr.utils.errors import ConfigError

__all__ = ["is_loopback", "free_port", "require_key_off_loopback", "require_loopback_for_dev_mode"]


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


def require_loopback_for_dev_mode(host: str, key_path: str) -> None:
    """Refuse a dev-mode vLLM server on a non-loopback ``host``, with or without an API key (see the
    module docstring: the key does not guard ``/collective_rpc``).

    Raises:
        ConfigError: at ``key_path`` (the host setting), saying why and what to do instead.
    """
    if not is_loopback(host):
        raise ConfigError(key_path, f"a managed vLLM replica runs in dev mode (the weight sync needs it), and would "
                                    f"listen on {host!r}, which other machines may reach: its /collective_rpc runs "
                                    "any method of its workers, and vLLM's --api-key does not guard that route (only "
                                    "/v1, /v2, /inference, /cohere). Keep managed replicas on 127.0.0.1; for servers "
                                    "on other machines run them yourself on a private network or behind an "
                                    "authenticating proxy and give rollout.server.urls")
