"""The environment of the Ray workers of a PPO run (verl's ``verl.trainer.constants_ppo``).

:func:`get_ppo_ray_runtime_env` gives the variables every worker gets (rlvr's
``WORKER_ENV_VARS``), leaving out those the launching shell sets already (a worker inherits them), and
with ``global_profiler.tool=torch`` points ``NVTX_INJECTION64_PATH`` at a library that does not exist:
an image that injects NVTX into libcupti (an Nsight set-up) holds the CUPTI subscription that torch's
profiler (Kineto) needs for device kernels, so its traces would have no CUDA activity. Set
``VERL_KEEP_NVTX_INJECTION=1`` to keep the inherited value.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from omegaconf import OmegaConf

from rlvr.single_controller.ray.base import WORKER_ENV_VARS

__all__ = ["NVTX_INJECTION_ENV", "PPO_RAY_RUNTIME_ENV", "get_ppo_ray_runtime_env"]

logger = logging.getLogger(__name__)

NVTX_INJECTION_ENV = "NVTX_INJECTION64_PATH"
KEEP_NVTX_INJECTION_ENV = "VERL_KEEP_NVTX_INJECTION"
NVTX_INJECTION_DISABLED = "/nonexistent/rlvr-disabled-nvtx-injection.so"
"""Not empty, so that a start-up hook setting the variable only when unset cannot bring libcupti back."""

PPO_RAY_RUNTIME_ENV = {"env_vars": dict(WORKER_ENV_VARS)}
"""Variables every Ray worker of a run gets (:func:`rlvr.single_controller.init_ray` sets them)."""


def get_ppo_ray_runtime_env(config: Any = None) -> dict[str, Any]:
    """``{"env_vars": {...}}`` for ``ray.init(runtime_env=...)`` (see the module docstring).

    Args:
        config: the run config (or any config with ``global_profiler.tool``); None: no profiler.
    """
    env_vars = {key: value for key, value in PPO_RAY_RUNTIME_ENV["env_vars"].items() if key not in os.environ}
    tool = OmegaConf.select(config, "global_profiler.tool", default=None) if config is not None else None
    if tool == "torch" and os.environ.get(KEEP_NVTX_INJECTION_ENV, "0") != "1":
        env_vars[NVTX_INJECTION_ENV] = NVTX_INJECTION_DISABLED
        logger.warning("global_profiler.tool=torch: %s=%s for every worker, so torch's profiler can record CUDA "
                       "kernels (inherited: %s); set %s=1 to keep the inherited value", NVTX_INJECTION_ENV,
                       NVTX_INJECTION_DISABLED, os.environ.get(NVTX_INJECTION_ENV) or "unset", KEEP_NVTX_INJECTION_ENV)
    return {"env_vars": env_vars}
