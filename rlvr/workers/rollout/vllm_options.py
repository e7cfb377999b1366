"""vLLM engine arguments from verl's rollout keys, for the in-process engine (``LLM(**options)``) and
the server replicas (``--key value``), so both read them the same way (no vLLM import here).

``enable_chunked_prefill`` (None: vLLM's default), ``max_model_len`` (None: prompt + response),
``disable_log_stats``, ``scheduling_policy``, ``cudagraph_capture_sizes`` (vLLM's
``compilation_config``; used with CUDA graphs, ``enforce_eager=false``), then
``engine_kwargs.vllm``, passed as they are and last (they win).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["engine_options", "server_args"]


def engine_options(rollout_config) -> dict[str, Any]:
    """The vLLM engine arguments that verl's rollout keys set (see the module docstring)."""
    cfg = rollout_config
    options: dict[str, Any] = {
        "max_model_len": int(cfg.max_model_len or int(cfg.prompt_length) + int(cfg.response_length)),
        "disable_log_stats": bool(cfg.disable_log_stats),
        "scheduling_policy": str(cfg.scheduling_policy),
    }
    if cfg.enable_chunked_prefill is not None:
        options["enable_chunked_prefill"] = bool(cfg.enable_chunked_prefill)
    if cfg.cudagraph_capture_sizes is not None:
        options["compilation_config"] = {"cudagraph_capture_sizes": [int(s) for s in cfg.cudagraph_capture_sizes]}
    options.update(_plain(cfg.engine_kwargs.vllm))
    return options


def _plain(value: Any) -> Any:
    """An OmegaConf node as plain Python (dicts and lists), other values unchanged."""
    try:
        from omegaconf import OmegaConf

        return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    except ImportError:  # pragma: no cover - OmegaConf is a dependency of rlvr
        return value


def server_args(options: dict[str, Any]) -> list[str]:
    """``options`` as vLLM server command-line arguments: ``--max-model-len 96``, ``True`` as a bare
    flag and ``False`` as ``--no-<flag>`` (vLLM's boolean options), dicts and lists as JSON."""
    args: list[str] = []
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            args.append(flag)
        elif value is False:
            args.append("--no-" + name.replace("_", "-"))
        elif value is not None:
            args += [flag, json.dumps(value) if isinstance(value, (dict, list)) else str(value)]
    return args
