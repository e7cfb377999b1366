"""Rollout through inference-server replicas (``rollout.mode=async``): the server engine, its
replicas, routing, weight folders and the server backends (vLLM's OpenAI server)."""

from rlvr.workers.rollout.server.backend import (
    SERVER_BACKENDS,
    Completion,
    LaunchSpec,
    ServerBackend,
    SyncCall,
    get_server_backend,
    register_server_backend,
)
from rlvr.workers.rollout.server.engine import ServerRollout
from rlvr.workers.rollout.server.vllm_backend import VLLMServerBackend

__all__ = [
    "SERVER_BACKENDS",
    "Completion",
    "LaunchSpec",
    "ServerBackend",
    "ServerRollout",
    "SyncCall",
    "VLLMServerBackend",
    "get_server_backend",
    "register_server_backend",
]
