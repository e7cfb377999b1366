"""The settings a run derives from its config, printed by ``rlvr`` before training starts.

These are the numbers users most often get wrong: how many prompts and samples a step takes,
how many mini-batches and optimizer steps one rollout feeds, how many micro-batches each worker
runs (gradient accumulation), the token budget, and which roles run in which processes. Only the
config is read (no torch, no files), so the summary costs nothing.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from rlvr.trainer.config.async_checks import rollout_apart, rollout_world_size
from rlvr.trainer.config.validate import reference_in_actor, use_reference, world_size
from rlvr.trainer.config.validate_models import frozen_model_notes
from rlvr.workers.megatron.layout import context_parallel_size, data_parallel_size, megatron_sizes, strategy_of


def _algorithm(cfg: DictConfig) -> str:
    actor, algo = cfg.actor_rollout_ref.actor, cfg.algorithm
    if not use_reference(cfg):
        reference, kl = "none", "none"
    else:
        reference = "the actor with its LoRA adapters off" if reference_in_actor(cfg) else "a frozen copy"
        kl = " and ".join(([f"in the loss ({actor.kl_loss_type}, coef {actor.kl_loss_coef:g})"] if actor.use_kl_loss
                           else []) + ([f"in the reward ({algo.kl_penalty}, coef {algo.kl_ctrl.kl_coef:g})"]
                                       if algo.use_kl_in_reward else []))
    return (f"{algo.adv_estimator} advantages, {actor.policy_loss.loss_mode} policy loss; critic: "
            f"{'yes' if cfg.critic.enable else 'no'}; reference: {reference}; KL: {kl}")


def _per_step(cfg: DictConfig) -> str:
    prompts, n = cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n
    length = cfg.data.max_prompt_length + cfg.data.max_response_length
    sequences = prompts * n
    return (f"{prompts} prompts x {n} samples = {sequences} sequences of at most {cfg.data.max_prompt_length} + "
            f"{cfg.data.max_response_length} = {length} tokens: up to {sequences * length:,} tokens per step, "
            f"{sequences * length // world_size(cfg):,} per worker")


def _updates(cfg: DictConfig, role: str, section: Any, dynamic_bsz: bool, token_budget: int) -> str:
    """Mini-batches and optimizer steps per rollout, and the micro-batches of one worker."""
    prompts, n = cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n
    workers = data_parallel_size(cfg, role)
    mini = section.ppo_mini_batch_size
    mini_batches = prompts // mini
    per_worker = mini * n // workers
    text = (f"{mini_batches} mini-batch(es) of {mini} prompts ({mini * n} sequences) x {section.ppo_epochs} epoch(s) "
            f"= {mini_batches * section.ppo_epochs} optimizer step(s) per rollout; each worker takes {per_worker} "
            f"sequences per mini-batch")
    if dynamic_bsz:
        length = cfg.data.max_prompt_length + cfg.data.max_response_length
        return (f"{text} in micro-batches of at most {token_budget:,} tokens (at least "
                f"{max(token_budget // length, 1)} full-length sequences each)")
    micro = section.ppo_micro_batch_size_per_gpu
    return f"{text} in {per_worker // micro} micro-batch(es) of {micro} (gradient accumulation)"


def _placement(cfg: DictConfig) -> str:
    apart = rollout_apart(cfg)
    roles = ["actor"] if apart else ["actor", "rollout"]
    if use_reference(cfg) and not reference_in_actor(cfg):
        roles.append("reference")
    if cfg.critic.enable:
        roles.append("critic")
    t = cfg.trainer
    device = {"auto": "a GPU each if CUDA is visible, else CPU", "cpu": "CPU", "cuda": "one GPU each"}[t.device]
    if t.backend == "local":
        where = f"{' + '.join(roles)} in the driver process ({device})"
        where += "; rollout in a child process" if apart else ""
    else:
        where = (f"{' + '.join(roles)} colocated in {world_size(cfg)} Ray worker process(es) "
                 f"({t.nnodes} node(s) x {t.n_gpus_per_node}; {device})")
        where += (f"; rollout in {rollout_world_size(cfg)} Ray worker process(es) of its own ({cfg.rollout.nnodes} "
                  f"node(s) x {cfg.rollout.n_gpus_per_node})") if apart else ""
    model_roles = {"actor": "actor", "reference": "ref", "critic": "critic"}
    megatron = ["{} {}x{}".format(name, *megatron_sizes(cfg, model_roles[name]))
                + (f" (context parallel {cp})" if (cp := context_parallel_size(cfg, model_roles[name])) > 1 else "")
                for name in roles if name in model_roles and strategy_of(cfg, model_roles[name]) == "megatron"]
    if megatron:
        where += (f"; megatron tensor x pipeline parallel: {', '.join(megatron)}"
                  + (" (the driver starts the extra ranks as processes)" if t.backend == "local" else ""))
    reward = cfg.reward_model
    scoring = (f"{reward.num_workers} processes of the parallel reward manager" if reward.reward_manager == "parallel"
               else f"the {reward.reward_manager} reward manager in the driver")
    if cfg.reward.routes:
        scoring = "routed by domain (reward.routes)"
    elif cfg.reward.reward_model.enable:
        scoring = "the reward model"
    return f"{where}; rewards: {scoring}"


_NAIVE = "rlvr's push above is that in-process / inter-process copy"
_NETWORK = ("its transfer engine is a library rlvr does not use; the push above carries the same weights "
            "(a speed difference only)")


def weight_push(cfg: DictConfig) -> str:
    """How new weights reach the rollout, and what verl's ``rollout.checkpoint_engine.backend``
    maps to (each of verl's transfer backends moves the same tensors: rlvr's path is decided by
    where the rollout runs)."""
    rollout = cfg.actor_rollout_ref.rollout
    if rollout.mode == "async":
        path = "written to a weights folder that every vLLM server replica reloads"
    elif rollout_apart(cfg):
        path = ("through shared memory to the rollout child process" if cfg.trainer.backend == "local"
                else "through the Ray object store to the rollout workers")
    elif rollout.name == "vllm":
        path = "copied in place into each worker's in-process vLLM engine"
    elif world_size(cfg) == 1 and rollout.dtype in (None, cfg.actor_rollout_ref.model.dtype):
        path = "none to push: the HF engine shares the actor's module"
    else:
        path = "copied in place into each worker's HF engine copy (gathered one parameter at a time)"
    backend = rollout.checkpoint_engine.backend
    return f"{path} (verl's checkpoint_engine.backend={backend}: {_NAIVE if backend == 'naive' else _NETWORK})"


def _schedule(cfg: DictConfig) -> str:
    t = cfg.trainer
    steps = f"{t.total_training_steps} steps" if t.total_training_steps is not None else f"{t.total_epochs} epoch(s)"
    budget = f" or {t.max_time_s:g} s, whichever comes first" if t.max_time_s is not None else ""
    validation = ("none" if cfg.data.val_files is None else
                  ("before training, " if t.val_before_train else "")
                  + (f"every {t.test_freq} steps and at the end" if t.test_freq > 0 else "at the end"))
    return f"{steps}{budget}; validation: {validation}; generation: {_generation(cfg)}"


def _generation(cfg: DictConfig) -> str:
    a = cfg.async_training
    if a.mode == "sync":
        return "synchronous (generate, then train)"
    if a.mode == "one_step":
        return "one_step (batch k+1 generated while batch k trains)"
    return (f"bounded (at most {a.max_staleness} version(s) stale, {a.staleness_policy}"
            + (", partial rollouts" if a.partial_rollout else "") + ")")


def _checkpoints(cfg: DictConfig) -> str:
    t = cfg.trainer
    when = f"every {t.save_freq} steps and at the end" if t.save_freq > 0 else "at the end"
    kept = checkpoints_to_keep(t, bool(cfg.critic.enable))
    keep = "all" if kept is None else f"the last {kept}"
    return f"{when} into {t.default_local_dir}/checkpoints (keep {keep}); resume: {t.resume_mode}"


def _recovery(cfg: DictConfig) -> str:
    t = cfg.trainer
    if t.backend == "local":
        return "in-process workers: a crash ends the run; rerun with trainer.resume_mode=auto to continue"
    if t.max_restarts == 0:
        return f"off (trainer.max_restarts=0): a dead worker or a call over {t.call_timeout_s:g} s ends the run"
    text = (f"up to {t.max_restarts} restart(s) after a dead worker or a call over {t.call_timeout_s:g} s, "
            "from the last whole checkpoint")
    return text + (" (only the end is saved: a restart goes back to step 0; set trainer.save_freq)"
                   if t.save_freq <= 0 else "")


ENGINE_NOTES = {
    "veomni": "verl's VeOmni engine is a library rlvr does not use; rlvr's FSDP2 runs the same computation",
    "torchtitan": "verl's TorchTitan engine is a library rlvr does not use; rlvr's FSDP2 runs the same computation",
}
"""``model_engine`` selections that rlvr runs with its own FSDP2 (a start-up note says so)."""


def _engine(cfg: DictConfig) -> str:
    strategy = strategy_of(cfg, "actor")
    engine = "Megatron-LM (megatron-core)" if strategy == "megatron" else "PyTorch FSDP2"
    note = ENGINE_NOTES.get(cfg.model_engine)
    return f"{engine} (model_engine={cfg.model_engine}{'; note: ' + note if note else ''})"
def _frozen_models(cfg: DictConfig) -> str | None:
    """Where the reward model and the teacher run, or None without either."""
    parts = []
    rm = cfg.reward.reward_model
    if rm.enable:
        where = (f"its own pool ({rm.nnodes} node(s) x {rm.n_gpus_per_node})" if rm.enable_resource_pool
                 else "colocated with the actor")
        use = "routed in reward.routes" if cfg.reward.routes else "the only reward"
        parts.append(f"reward model {rm.model_path} ({use}) {where}")
    dist = cfg.distillation
    if dist.enabled:
        where = f"its own pool ({dist.nnodes} node(s) x {dist.n_gpus_per_node})" if dist.nnodes > 0 else "colocated with the actor"
        loss = dist.distillation_loss
        parts.append(f"teacher {dist.teacher_models['teacher_model'].model_path} ({loss.loss_mode} loss, "
                     + (f"x{loss.distillation_loss_coef:g} beside the task rewards" if loss.use_task_rewards else "alone")
                     + f") {where}")
    return "; ".join(parts) or None


def describe_run(cfg: DictConfig) -> str:
    """A few lines with the settings derived from ``cfg`` (a checked, finalised config)."""
    rows = [("algorithm", _algorithm(cfg)), ("engine", _engine(cfg)), ("per step", _per_step(cfg)),
            ("actor updates", _updates(cfg, "actor", cfg.actor_rollout_ref.actor,
                                       cfg.actor_rollout_ref.actor.use_dynamic_bsz,
                                       cfg.actor_rollout_ref.actor.ppo_max_token_len_per_gpu))]
    if cfg.critic.enable:
        rows.append(("critic updates", _updates(cfg, "critic", cfg.critic, cfg.critic.use_dynamic_bsz,
                                                cfg.critic.ppo_max_token_len_per_gpu)))
    rows += [("workers", _placement(cfg)), ("weight sync", weight_push(cfg)), ("schedule", _schedule(cfg)),
             ("checkpoints", _checkpoints(cfg)),
             ("recovery", _recovery(cfg))]
    frozen = _frozen_models(cfg)
    if frozen is not None:
        rows.append(("scoring models", frozen))
    rows += [("note", note) for note in frozen_model_notes(cfg)]
    return "\n".join(["rlvr: derived settings"] + [f"  {label:<15}{text}" for label, text in rows])


def checkpoints_to_keep(trainer_config, with_critic: bool) -> int | None:
    """How many whole checkpoints to keep: ``trainer.max_actor_ckpt_to_keep``, and
    ``max_critic_ckpt_to_keep`` when a critic trains (verl prunes the roles' states separately; a
    rlvr checkpoint is whole or not resumable, so the smallest limit applies); None = all."""
    limits = [trainer_config.max_actor_ckpt_to_keep]
    if with_critic:
        limits.append(trainer_config.max_critic_ckpt_to_keep)
    limits = [int(k) for k in limits if k is not None]
    return min(limits) if limits else None
