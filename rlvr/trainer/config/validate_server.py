"""Config checks of rollout through servers (``rollout.mode=async``, ``rollout.server``) and of
rlvr's OpenAI-compatible endpoint (``rollout.agent.openai``), before anything starts.

Security first (:mod:`rlvr.utils.net`): a managed vLLM replica (dev mode) on a non-loopback address
is refused, key or not (vLLM's key does not guard its dev routes); the endpoint off loopback needs a key.
"""

from __future__ import annotations

import importlib.util
import os
import shutil

from omegaconf import DictConfig

from rlvr.utils.errors import VLLM_MISSING, ConfigError
from rlvr.utils.net import require_key_off_loopback, require_loopback_for_dev_mode

__all__ = ["check_rollout_server", "check_openai_endpoint"]

MODES = ("sync", "async")
SERVER_ENGINES = ("vllm",)
"""Engines with a server backend (``rlvr.workers.rollout.server``)."""


def _require(condition: bool, key: str, message: str) -> None:
    if not condition:
        raise ConfigError(key, message)


def check_rollout_server(rollout: DictConfig) -> None:
    """``rollout.mode`` and, for ``async``, the ``rollout.server`` section."""
    key = "actor_rollout_ref.rollout"
    _require(rollout.mode in MODES, f"{key}.mode", f"{rollout.mode!r} is not a rollout mode; use one of {MODES}")
    if rollout.mode != "async":
        return
    _require(rollout.name in SERVER_ENGINES, f"{key}.mode",
             f"rollout.mode=async runs the engine as servers, which rollout.name={rollout.name!r} has no backend "
             f"for; use rollout.name in {SERVER_ENGINES} or rollout.mode=sync")
    server, at = rollout.server, f"{key}.server"
    for name in ("startup_timeout_s", "request_timeout_s", "sync_timeout_s"):
        _require(server[name] > 0, f"{at}.{name}", "must be > 0 seconds")
    _require(server.max_retries >= 0, f"{at}.max_retries", "must be >= 0")
    _require(server.max_restarts >= 0, f"{at}.max_restarts", "must be >= 0")
    _require(server.max_concurrent_requests >= 1, f"{at}.max_concurrent_requests", "must be >= 1")
    if server.urls:
        for i, url in enumerate(server.urls):
            _require(str(url).startswith("http://"), f"{at}.urls", f"entry {i} ({url!r}) must look like http://host:port")
        _require(server.weights_dir is not None, f"{at}.weights_dir",
                 "servers you run read the new weights from a folder after every update: set weights_dir to a "
                 "folder the trainer can write and every server can read at the same path")
        return
    _require(server.num_replicas >= 1, f"{at}.num_replicas", "must be >= 1 replica (or give urls)")
    for name in ("cpu_binds", "cuda_devices"):
        _require(not server[name] or len(server[name]) == server.num_replicas, f"{at}.{name}",
                 f"has {len(server[name])} entries for {server.num_replicas} replicas: give one per replica (or none)")
    _require(0 <= server.port < 65536 - server.num_replicas, f"{at}.port", "must be 0 (free ports) or a port number")
    _require(server.kv_cache_space_gb >= 1, f"{at}.kv_cache_space_gb", "must be >= 1 GiB (a whole number)")
    require_loopback_for_dev_mode(str(server.host), f"{at}.host")
    if server.python is None:
        _require(importlib.util.find_spec("vllm") is not None, f"{at}.python",
                 f"managed replicas run vLLM in this Python by default, and it has none: set {at}.python to a "
                 f"Python that has it (e.g. .venv-vllm/bin/python). {VLLM_MISSING}")
    else:
        found = shutil.which(str(server.python))
        _require(found is not None and os.access(found, os.X_OK), f"{at}.python",
                 f"{server.python!r} is not an executable Python; give the path of one with vLLM installed")


def check_openai_endpoint(agent: DictConfig, default_loop: str) -> None:
    """``rollout.agent.openai`` when the ``openai_agent`` loop is the default (rows that name it
    are checked when the loop is built)."""
    at = "actor_rollout_ref.rollout.agent.openai"
    endpoint = agent.openai
    _require(endpoint.max_request_bytes >= 1024, f"{at}.max_request_bytes", "must be >= 1024 bytes")
    _require(endpoint.max_concurrent_runs >= 1, f"{at}.max_concurrent_runs", "must be >= 1")
    _require(endpoint.run_timeout_s > 0, f"{at}.run_timeout_s", "must be > 0 seconds")
    _require(0 <= endpoint.port < 65536, f"{at}.port", "must be 0 (a free port) or a port number")
    require_key_off_loopback(str(endpoint.host), endpoint.api_key, f"{at}.api_key",
                             "rlvr's OpenAI-compatible endpoint (it generates with the policy)")
    if default_loop == "openai_agent":
        _require(endpoint.run is not None and ":" in str(endpoint.run), f"{at}.run",
                 "the openai_agent loop needs the agent function: 'package.module:function' or "
                 "'path/to/file.py:function', a function run(client, row) -> answer")
