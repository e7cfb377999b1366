"""Which training backend each model role uses and, for Megatron, its tensor x pipeline x data layout.

Plain Python on the run config (no torch, no megatron-core): the config check and the workers
both read it. Roles that share a process (the actor, a separate reference, the critic: colocated
on every rank) share megatron-core's process-global layout, so an unset size of the reference or
the critic follows the actor's when the actor uses Megatron.
"""

from __future__ import annotations

import importlib.util
import math
from typing import TYPE_CHECKING

from rlvr.utils.errors import ConfigError
from rlvr.workers.megatron.lora_spec import LoraSpec

if TYPE_CHECKING:
    from rlvr.trainer.config.schema import RefMegatronConfig

__all__ = ["MEGATRON_INSTALL", "megatron_installed", "strategy_of", "megatron_sizes", "context_parallel_size",
           "expert_sizes", "data_parallel_size", "check_megatron_config", "check_megatron_lora", "megatron_lora"]

MEGATRON_INSTALL = "pip install 'rlvr[megatron]' (or `make setup-megatron` in a clone)"
"""How to install the Megatron backend, for error messages."""

def megatron_installed() -> bool:
    """Whether megatron-core is importable (without importing it)."""
    return importlib.util.find_spec("megatron") is not None and importlib.util.find_spec("megatron.core") is not None


def strategy_of(cfg, role: str) -> str:
    """The strategy of ``role`` (``actor``, ``ref`` or ``critic``); the reference's None is the actor's."""
    if role == "critic":
        return cfg.critic.strategy
    if role == "ref" and cfg.actor_rollout_ref.ref.strategy is not None:
        return cfg.actor_rollout_ref.ref.strategy
    return cfg.actor_rollout_ref.actor.strategy


def megatron_section(cfg, role: str) -> RefMegatronConfig:
    """The ``megatron`` section of ``role`` (``actor``, ``ref`` or ``critic``)."""
    return _megatron_config(cfg, role)


def _megatron_config(cfg, role: str) -> RefMegatronConfig:
    if role == "critic":
        return cfg.critic.megatron
    return cfg.actor_rollout_ref.ref.megatron if role == "ref" else cfg.actor_rollout_ref.actor.megatron


def megatron_sizes(cfg, role: str) -> tuple[int, int]:
    """``(tensor_model_parallel_size, pipeline_model_parallel_size)`` of ``role``; unset sizes are 1
    for the actor and the actor's for the others (1 when the actor does not use Megatron)."""
    defaults = (1, 1)
    if role != "actor" and strategy_of(cfg, "actor") == "megatron":
        defaults = megatron_sizes(cfg, "actor")
    own = _megatron_config(cfg, role)
    return (own.tensor_model_parallel_size or defaults[0], own.pipeline_model_parallel_size or defaults[1])


def expert_sizes(cfg, role: str) -> tuple[int, int]:
    """``(expert_model_parallel_size, expert_tensor_parallel_size)`` of ``role``: unset sizes follow
    the actor's settings for the other roles; an expert-tensor size unset there too is the role's
    tensor-parallel size (verl's rule), an expert size 1."""
    own = _megatron_config(cfg, role)
    actor = cfg.actor_rollout_ref.actor.megatron if role != "actor" and strategy_of(cfg, "actor") == "megatron" else own
    ep = own.expert_model_parallel_size or actor.expert_model_parallel_size or 1
    etp = own.expert_tensor_parallel_size or actor.expert_tensor_parallel_size or megatron_sizes(cfg, role)[0]
    return ep, etp


def context_parallel_size(cfg, role: str) -> int:
    """``megatron.context_parallel_size`` of ``role``: unset is 1 for the actor and the actor's for the
    others (1 when the actor does not use Megatron)."""
    own = _megatron_config(cfg, role).context_parallel_size
    if own is not None:
        return own
    return context_parallel_size(cfg, "actor") if role != "actor" and strategy_of(cfg, "actor") == "megatron" else 1


def data_parallel_size(cfg, role: str) -> int:
    """Ranks that hold different data for ``role``: the workers on Ray divided by the model-parallel
    size (tensor x context x pipeline) with Megatron; 1 on the local backend (where a Megatron worker
    starts its model-parallel ranks itself)."""
    if cfg.trainer.backend == "local":
        return 1
    workers = cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node
    if strategy_of(cfg, role) != "megatron":
        return workers
    tp, pp = megatron_sizes(cfg, role)
    return max(1, workers // max(1, tp * pp * context_parallel_size(cfg, role)))  # sizes < 1: check_megatron_config


_KEYS = {"actor": "actor_rollout_ref.actor", "ref": "actor_rollout_ref.ref", "critic": "critic"}


def _check_role(cfg, role: str) -> None:
    key = _KEYS[role]
    if not megatron_installed():
        raise ConfigError(f"{key}.strategy", f"megatron needs megatron-core, which is not installed: {MEGATRON_INSTALL}")
    tp, pp = megatron_sizes(cfg, role)
    cp = context_parallel_size(cfg, role)
    if tp < 1 or pp < 1:
        raise ConfigError(f"{key}.megatron.tensor_model_parallel_size",
                          f"the tensor and pipeline parallel sizes must be >= 1, got {tp} and {pp}")
    if cp < 1:
        raise ConfigError(f"{key}.megatron.context_parallel_size", f"must be >= 1 (1 = no context parallelism), got {cp}")
    model, model_key = ((cfg.critic.model, "critic.model") if role == "critic"
                        else (cfg.actor_rollout_ref.model, "actor_rollout_ref.model"))
    if model.lora_rank > 0:
        raise ConfigError(f"{model_key}.lora_rank", "model.lora_rank is the FSDP engines' (peft) LoRA; with "
                          "strategy=megatron set model.lora.rank (and lora.alpha, lora.target_modules) instead")
    t = cfg.trainer
    workers = t.nnodes * t.n_gpus_per_node
    if t.backend == "ray" and workers % (tp * cp * pp):
        raise ConfigError(f"{key}.megatron.tensor_model_parallel_size",
                          f"{workers} workers (trainer.nnodes x trainer.n_gpus_per_node) do not split into blocks of "
                          f"tensor_model_parallel_size={tp} x context_parallel_size={cp} x "
                          f"pipeline_model_parallel_size={pp} ranks; use sizes whose product divides the number of workers")
    _check_experts(cfg, role, key)


def _check_experts(cfg, role: str, key: str) -> None:
    """The expert sizes: >= 1, and the ranks of a pipeline stage split into expert blocks."""
    ep, etp = expert_sizes(cfg, role)
    tp, pp = megatron_sizes(cfg, role)
    cp = context_parallel_size(cfg, role)
    if ep < 1 or etp < 1:
        raise ConfigError(f"{key}.megatron.expert_model_parallel_size",
                          f"the expert and expert-tensor parallel sizes must be >= 1, got {ep} and {etp}")
    t = cfg.trainer
    stage_ranks = math.lcm(tp * cp, ep * etp) if t.backend == "local" else t.nnodes * t.n_gpus_per_node // pp
    if stage_ranks % (ep * etp):
        raise ConfigError(f"{key}.megatron.expert_model_parallel_size",
                          f"each pipeline stage has {stage_ranks} ranks, which do not split into blocks of "
                          f"expert_model_parallel_size={ep} x expert_tensor_parallel_size={etp}; use sizes whose "
                          "product divides them")
    if ep > 1 and cp > 1:
        raise ConfigError(f"{key}.megatron.context_parallel_size",
                          f"context_parallel_size={cp} with expert_model_parallel_size={ep}: rlvr's Megatron MoE layers "
                          "(routing replay, load-balancing loss, expert-load metrics) see whole sequences, not a "
                          "context-parallel rank's chunks; use context_parallel_size=1 with a mixture-of-experts model")
    if ep > 1 and (role == "critic" and cfg.critic.use_dynamic_bsz or role != "critic" and
                   cfg.actor_rollout_ref.actor.use_dynamic_bsz):
        raise ConfigError(f"{key}.use_dynamic_bsz" if role == "critic" else "actor_rollout_ref.actor.use_dynamic_bsz",
                          f"expert_model_parallel_size={ep}: the expert-parallel ranks exchange their tokens every "
                          "layer (megatron's allgather dispatcher), so their micro-batches must have the same shape; "
                          "token budgets give them different ones. Use micro-batches by count")


def megatron_lora(cfg) -> bool:
    """Whether the actor trains Megatron LoRA adapters (``actor_rollout_ref.model.lora.rank > 0``)."""
    return cfg.actor_rollout_ref.model.lora.rank > 0


def check_megatron_lora(cfg) -> None:
    """Raise :class:`ConfigError` for ``model.lora`` settings rlvr does not run: on a role that is not a
    Megatron actor, sequence parallelism, types other than lora / canonical_lora, bad values."""
    if cfg.critic.model.lora.rank > 0:
        raise ConfigError("critic.model.lora.rank", "Megatron LoRA is for the actor; the critic trains all its weights "
                          "(set critic.model.lora.rank=0; FSDP critics have critic.model.lora_rank)")
    if not megatron_lora(cfg):
        return
    key = "actor_rollout_ref.model.lora"
    if strategy_of(cfg, "actor") != "megatron":
        raise ConfigError(f"{key}.rank", "model.lora is the Megatron engine's LoRA (verl ignores it with FSDP); with "
                          "strategy=fsdp/fsdp2 set model.lora_rank, lora_alpha and target_modules instead")
    lora = cfg.actor_rollout_ref.model.lora
    if lora.type in ("dora", "vlm_lora"):
        what = "weight-decomposed LoRA (DoRA)" if lora.type == "dora" else "LoRA of vision-language models"
        raise ConfigError(f"{key}.type", f"type={lora.type}: {what} is not in rlvr's Megatron engine; use lora or "
                          "canonical_lora")
    overrides = dict(cfg.actor_rollout_ref.actor.megatron.override_transformer_config)
    if overrides.get("sequence_parallel"):
        raise ConfigError("actor_rollout_ref.actor.megatron.override_transformer_config.sequence_parallel",
                          "LoRA with sequence_parallel is not in rlvr (its adapters run on whole sequences); "
                          "leave sequence_parallel off")
    problems = LoraSpec.from_config(lora).problems()
    if problems:
        raise ConfigError(key, "; ".join(problems))


def check_megatron_config(cfg, roles: list[str]) -> None:
    """Raise :class:`ConfigError` when a role of ``roles`` (the model roles the run starts) uses
    Megatron without megatron-core, with sizes that do not fit the workers, or with sizes other than
    another Megatron role of the same processes; and for ``model.lora`` settings rlvr does not run."""
    check_megatron_lora(cfg)
    megatron_roles = [role for role in roles if strategy_of(cfg, role) == "megatron"]
    for role in megatron_roles:
        _check_role(cfg, role)
    for role in megatron_roles[1:]:
        first = megatron_roles[0]
        if context_parallel_size(cfg, role) != context_parallel_size(cfg, first):
            raise ConfigError(f"{_KEYS[role]}.megatron.context_parallel_size",
                              f"context_parallel_size={context_parallel_size(cfg, role)} differs from the {first}'s "
                              f"{context_parallel_size(cfg, first)}; the model roles share each worker process and "
                              "megatron-core's layout is global to a process: give them the same size (or leave it unset)")
        if megatron_sizes(cfg, role) + expert_sizes(cfg, role) != megatron_sizes(cfg, first) + expert_sizes(cfg, first):
            raise ConfigError(
                f"{_KEYS[role]}.megatron.tensor_model_parallel_size",
                f"(tensor, pipeline, expert, expert tensor) parallel sizes {megatron_sizes(cfg, role) + expert_sizes(cfg, role)} "
                f"differ from the {first}'s {megatron_sizes(cfg, first) + expert_sizes(cfg, first)}; the model roles "
                "share each worker process and megatron-core's layout "
                "is global to a process: give them the same sizes (or leave them unset: they follow the actor's)")
