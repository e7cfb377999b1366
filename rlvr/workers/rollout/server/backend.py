"""What a server engine needs from one kind of inference server, and their registry.

The server engine (:mod:`rlvr.workers.rollout.server.engine`) does the routing, retries, restarts,
weight files and the engine protocol; a :class:`ServerBackend` says how to talk to one kind of
server: its command line, its health route, its token-in/token-out generate request and answer, and
its weight-reload sequence. vLLM's OpenAI server is registered (``vllm``); an SGLang or TGI backend
would register the same way under its engine name (``actor_rollout_ref.rollout.name``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from rlvr.utils.registry import Registry

__all__ = ["ServerBackend", "LaunchSpec", "Completion", "SyncCall", "SERVER_BACKENDS", "register_server_backend",
           "get_server_backend"]


@dataclass(frozen=True)
class LaunchSpec:
    """How to start one managed replica.

    Attributes:
        python: the Python that runs the server.
        model_dir: the policy as a Hugging Face folder (config, tokenizer, weights at start).
        host, port: where it listens.
        api_key: the key it requires (None: none).
        seed: its sampling seed.
        dtype: the weights' dtype (``float32``, ``bfloat16``).
        cpu_bind: its CPU cores (None: the server's default).
        cuda_devices: its ``CUDA_VISIBLE_DEVICES`` (None: inherited).
        kv_cache_gb: its CPU KV cache in GiB.
        extra_args: more arguments of its command line.
        rollout: the ``rollout`` config section (lengths, engine options).
    """

    python: str
    model_dir: str
    host: str
    port: int
    api_key: str | None
    seed: int
    dtype: str
    cpu_bind: str | None
    cuda_devices: str | None
    kv_cache_gb: int
    extra_args: list[str]
    rollout: Any


@dataclass(frozen=True)
class Completion:
    """One sampled response as a server reports it.

    Attributes:
        token_ids: the sampled ids.
        log_probs: the log-prob of each sampled id.
        versions: the weights version of each sampled id (from the server's per-span report).
    """

    token_ids: list[int]
    log_probs: list[float]
    versions: list[int]


@dataclass(frozen=True)
class SyncCall:
    """One call of the weight-sync sequence: the stage name (a timing metric), method, path, body."""

    stage: str
    method: str
    path: str
    payload: Any


class ServerBackend(Protocol):
    """One kind of inference server."""

    health_path: str
    """A route that answers 200 once the server can serve."""

    def launch(self, spec: LaunchSpec, base_env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        """The command line and the whole environment of a managed replica."""
        ...

    def generate_request(self, prompt_ids: list[int], sampling: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """``(path, body)`` of a token-in/token-out request for one sample. ``sampling`` has
        ``max_tokens``, ``temperature`` (0 = greedy), ``top_p``, ``top_k`` (-1 = off), ``seed``,
        ``stop`` (strings, the completing token kept), ``stop_token_ids`` (None: never stop at an id)."""
        ...

    def parse_generate(self, answer: Any) -> Completion:
        """The sampled ids, their log-probs and weight versions from the answer.

        Raises:
            ValueError: the answer lacks them (the message says what is missing).
        """
        ...

    def version_call(self, version: int) -> SyncCall:
        """The call that labels the server's current weights as ``version`` (reported per token)."""
        ...

    def sync_calls(self, weights_path: str, version: int) -> list[SyncCall]:
        """The calls that make a running server load the weights folder ``weights_path`` as
        ``version``, in order (generation paused around the load, caches of old weights dropped)."""
        ...


ServerBackendFactory = Callable[[], ServerBackend]
SERVER_BACKENDS: Registry[ServerBackendFactory] = Registry("rollout server backend")


def register_server_backend(name: str) -> Callable[[ServerBackendFactory], ServerBackendFactory]:
    """Decorator registering a backend class (built without arguments) under an engine name."""
    return SERVER_BACKENDS.register(name)


def get_server_backend(name: str) -> ServerBackend:
    """A new backend for engine ``name``; an unknown name raises ``KeyError`` listing the valid ones."""
    return SERVER_BACKENDS.get(name)()
