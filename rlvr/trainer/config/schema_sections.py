"""Small sections of the run schema that verl 0.9's config has and rlvr honours (imported by
:mod:`~rlvr.trainer.config.schema`, which holds the rest)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from rlvr.utils.config_field import config_field as _f

CHECKPOINT_CONTENTS = ("model", "optimizer", "extra", "hf_model")
"""What a role's checkpoint may hold (verl's names): its model, optimizer and extra (LR schedule,
RNG) states, and a Hugging Face export of the model."""

CHECKPOINT_ENGINE_BACKENDS = ("naive", "nccl", "nixl", "hccl", "mooncake", "kimi_ckpt_engine")
"""verl's weight-transfer backends; rlvr maps each onto its own push paths (see docs/rollout.md)."""


@dataclass
class CustomClassConfig:
    """A class of the user's named by file and name (verl's ``data.custom_cls``)."""

    path: Optional[str] = _f(None, "python file (or module) that defines the class; None = rlvr's RLHFDataset")
    name: Optional[str] = _f(None, "class name in path: a torch Dataset subclass taking (data_files, tokenizer, config, processor)")


@dataclass
class CheckpointConfig:
    """What a trained role's checkpoint holds (verl's ``<role>.checkpoint``)."""

    save_contents: list = _f(["model", "optimizer", "extra"], "model, optimizer and extra (schedule, RNG) are always saved, so a resume continues exactly; add hf_model to also export the model as a Hugging Face folder into each checkpoint (<step>/<role>/huggingface)")
    load_contents: list = _f(["model", "optimizer", "extra"], "what a resume restores: model, optimizer and extra (all three: a resume continues the run exactly)")


@dataclass
class EngineKwargsConfig:
    """Extra keyword arguments of the inference engines (verl's ``rollout.engine_kwargs``)."""

    vllm: dict = _f({}, "passed to vLLM's engine (LLM(...) in sync mode, the server's --key value in async mode), e.g. swap_space, disable_mm_preprocessor_cache")


@dataclass
class CheckpointEngineConfig:
    """How new weights reach the rollout (verl's ``rollout.checkpoint_engine``)."""

    backend: str = _f("naive", "verl's weight-transfer backend, mapped onto rlvr's push paths: naive (in-process copy, the local backend's shared memory, or a server's weight folder) | nccl / nixl / hccl / mooncake / kimi_ckpt_engine (the same pushes: rlvr's transfers are its own)")


@dataclass
class RayInitConfig:
    """Arguments of ``ray.init`` (verl's ``ray_kwargs.ray_init``)."""

    num_cpus: Optional[int] = _f(None, "CPUs Ray may use on this node (None = the workers' count on CPU, Ray's own count with GPUs)")


@dataclass
class RayKwargsConfig:
    """Ray start-up settings (verl's ``ray_kwargs``)."""

    ray_init: RayInitConfig = field(default_factory=RayInitConfig, metadata={"help": "arguments of ray.init when rlvr starts Ray"})
