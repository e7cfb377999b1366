"""A vLLM OpenAI server that serves a fixed model (an LLM judge), started and stopped by rlvr.

Unlike the rollout's replicas (:mod:`rlvr.workers.rollout.server.engine`) it never takes new
weights, so it runs without vLLM's dev mode: only the OpenAI routes (``/v1/chat/completions``) and
``/health``. The process is a :class:`~rlvr.workers.rollout.server.replica.ManagedReplica` (its own
process group, stopped with its parent, its log kept); the command is vLLM's OpenAI API server on
the model's Hugging Face folder (a GGUF model is dequantised to one first), in eager mode with
32-token KV blocks on CPU as for the rollout's replicas.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from rlvr.utils.model import local_model_dir
from rlvr.utils.net import free_port, require_key_off_loopback
from rlvr.workers.rollout.server.replica import ManagedReplica
from rlvr.workers.rollout.server.vllm_backend import CPU_BLOCK_SIZE

__all__ = ["ManagedOpenAIServer", "vllm_openai_command"]


def vllm_openai_command(python: str, model_dir: str, served_name: str, host: str, port: int, config: Any,
                        on_gpu: bool, api_key: str | None) -> list[str]:
    """The command line of vLLM's OpenAI server for ``model_dir`` under the name ``served_name``
    (``config``: a :class:`~rlvr.reward.config.JudgeServerConfig`)."""
    command = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
               "--served-model-name", served_name, "--host", host, "--port", str(port), "--dtype", str(config.dtype),
               "--max-model-len", str(int(config.max_model_len))]
    if not on_gpu:
        command += ["--enforce-eager", "--block-size", str(CPU_BLOCK_SIZE)]
    if api_key:
        command += ["--api-key", api_key]
    return command + [str(arg) for arg in config.extra_args]


class ManagedOpenAIServer:
    """One vLLM OpenAI server subprocess serving ``model_path`` as ``served_name``.

    Args:
        model_path: folder, GGUF file, hub id or alias of the model.
        served_name: the model name clients send.
        config: a :class:`~rlvr.reward.config.JudgeServerConfig` (python, host, port, dtype, lengths,
            KV cache, thread binding, time limit, log folder, extra arguments).
        api_key: the key it requires (None: none; required off loopback).
        key_path: the config key of ``api_key``, for errors.

    Attributes:
        api_base: ``http://host:port/v1`` once :meth:`start` returned.
    """

    def __init__(self, model_path: str, served_name: str, config: Any, api_key: str | None = None,
                 key_path: str = "reward.workers.llm_judge.judge_api_key_env") -> None:
        require_key_off_loopback(config.host, api_key, key_path, "the judge's vLLM server")
        self.config, self.api_key = config, api_key
        port = int(config.port) or free_port(config.host)
        log_dir = Path(config.log_dir) if config.log_dir else Path(tempfile.mkdtemp(prefix="rlvr-judge-"))
        on_gpu = torch.cuda.is_available()
        command = vllm_openai_command(config.python or sys.executable, local_model_dir(model_path), served_name,
                                      config.host, port, config, on_gpu, api_key)
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(int(config.kv_cache_space_gb)),
               "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # an in-process engine's setting must not leak in
        if config.cpu_bind is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = str(config.cpu_bind)
        self.replica = ManagedReplica(0, config.host, port, api_key, command, env, log_dir / "judge-server.log", "/health")
        self.api_base = f"http://{config.host}:{port}/v1"

    def start(self) -> float:
        """Start the server and wait until it answers; returns the seconds it took.

        Raises:
            ReplicaUnavailable: it exited or did not answer within ``startup_timeout_s`` (with the end
                of its log).
        """
        self.replica.start()
        return self.replica.wait_ready(float(self.config.startup_timeout_s))

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and wait for it to exit."""
        self.replica.stop()
