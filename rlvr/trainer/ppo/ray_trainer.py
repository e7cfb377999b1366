"""The PPO-family trainer: one driver process that drives role worker groups (verl's trainer API).

One step of :meth:`RayPPOTrainer.fit`, each stage timed as ``timing_s/<stage>`` (verl's names)::

    gen           prompts (uid each) x rollout.n  -> actor_rollout.generate_sequences
    reward        reward_fn on the responses      -> token_level_scores (+ acc per sample); with
                  reward.routes each domain by its reward worker group or manager; with a reward
                  model, its rm_scores first (:mod:`rlvr.trainer.ppo.frozen_roles`)
                  (DAPO dynamic sampling: drop groups that all agree, generate more)
    old_log_prob  actor.compute_log_prob          -> old_log_probs, entropy metric; the rollout/actor
                  log-prob mismatch metrics; the rollout correction (IS weights, rejection) if set,
                  as in verl's decoupled mode (rejected tokens leave response_mask from here on);
                  in verl's bypass mode the rollout's log-probs are the old policy (no actor call);
                  with async_training.prox_log_prob_from_update (one optimizer step per batch) the
                  update's own forward pass is the proximal policy (no actor call here either)
    ref           ref.compute_ref_log_prob        -> ref_log_prob       (KL in loss or reward only)
    teacher       teacher.compute_teacher_log_prob -> the teacher's scores (on-policy distillation only)
    values        critic.compute_values           -> values             (with a critic only)
    adv           KL penalty in the reward, then the registered advantage estimator (driver)
    update_critic critic.update_critic                                   (with a critic only)
    update_actor  actor.update_actor (after trainer.critic_warmup steps)
    update_weights the hybrid worker loads the new weights into its rollout engine in place; every
                  generation is checked to come from the actor's current weights version

With ``actor_rollout_ref.hybrid_engine=false`` the rollout runs in a worker group of its own and
``gen`` takes the step's samples from the asynchronous schedule (:mod:`rlvr.trainer.async_schedule`:
``async_training.mode`` sync, one_step or bounded), which generates them ahead, overlapped with
training; ``update_weights`` pushes the new weights to the rollout workers.

Validation (``rollout.val_kwargs``, ``n`` samples per prompt; :mod:`rlvr.trainer.ppo.validation`) runs
before training if asked, every ``test_freq`` steps and at the end (``trainer.val_only``: once, and no
training); checkpoints (:mod:`rlvr.trainer.ppo.driver_state`) every ``save_freq`` steps and at the end.
With ``trainer.rollout_data_dir`` every step's samples are written to ``<dir>/<step>.jsonl``
(:mod:`rlvr.trainer.generations`).

Faults (see :mod:`rlvr.trainer.recovery`): on the Ray backend a dead or hung worker makes the
trainer tear down and restart every worker group, restore the last whole checkpoint and go on, up
to ``trainer.max_restarts`` times. SIGINT/SIGTERM (:mod:`rlvr.trainer.graceful_stop`) finish the
current step, write a checkpoint and return from :meth:`RayPPOTrainer.fit`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf

from rlvr.agent.metrics import tool_use_metrics
from rlvr.protocol import DataProto
from rlvr.reward.routing import (
    RewardWorkerGroups,
    check_data_routes,
    check_reward_functions,
    reward_routers,
    routed_worker_names,
)
from rlvr.single_controller import ClassWithInitArgs
from rlvr.trainer.async_schedule import AsyncRollout, prox_log_prob_from_update, rollout_correction_config
from rlvr.trainer.async_schedule.placement import ROLLOUT_GROUP, start_rollout_group
from rlvr.trainer.checkpoint import RunCheckpoints
from rlvr.trainer.config import to_config, use_reference, validate_config, world_size
from rlvr.trainer.config.async_checks import rollout_apart
from rlvr.trainer.config.validate import reference_in_actor
from rlvr.trainer.data import StatefulBatchIterator, collate_fn as default_collate_fn
from rlvr.trainer.data import create_rl_dataset, create_rl_sampler
from rlvr.trainer.generations import REWARD_EXTRA_INFO, dump_batch
from rlvr.trainer.ppo.balance import balance_batch, update_layouts
from rlvr.trainer.ppo.batch_steps import (
    apply_kl_penalty,
    compute_advantage,
    compute_response_mask,
    compute_spec_decode_metrics,
)
from rlvr.trainer.ppo.core_algos import agg_loss, get_adv_estimator_needs, get_kl_controller
from rlvr.trainer.ppo.driver_state import DriverStateMixin
from rlvr.trainer.ppo.frozen_roles import FrozenRolesMixin
from rlvr.trainer.ppo.dynamic_sampling import GroupAccumulator
from rlvr.trainer.ppo.metric_utils import (
    RolloutMoELoadBalanceMetricsAccumulator,
    compute_data_metrics,
    compute_moe_lb_metrics,
    compute_throughout_metrics,
    compute_timing_metrics,
    compute_variance_proxy_metrics,
    per_source_metrics,
    reduce_metrics,
    sample_accuracy,
)
from rlvr.trainer.ppo.resource_pool import ResourcePoolManager
from rlvr.trainer.ppo.reward import compute_reward
from rlvr.trainer.ppo.rollout_correction import (
    PROX_FROM_UPDATE_KEY,
    bypass_old_log_probs,
    compute_rollout_correction_and_add_to_batch,
    compute_rollout_mismatch_metrics,
    prox_from_update_settings,
)
from rlvr.trainer.ppo.utils import Role
from rlvr.trainer.ppo.validation import ValidationMixin
from rlvr.trainer.run_settings import checkpoints_to_keep
from rlvr.trainer.ppo.worker_groups import TrainerWorkerGroups
from rlvr.trainer.graceful_stop import GracefulStop
from rlvr.trainer.progress import TrainingProgress
from rlvr.trainer.recovery import RECOVERABLE_ERRORS, Recovery, RestartableGroup
from rlvr.trainer.tracking import Tracking
from rlvr.utils.errors import ConfigError
from rlvr.utils.multimodal import MULTI_MODAL_DATA, MULTI_MODAL_INPUTS
from rlvr.utils.profiler.summary import StepProfiler, resolve_save_paths
from rlvr.utils.torch_functional import masked_mean
from rlvr.workers.moe.layout import ROUTED_EXPERTS
from rlvr.workers.rollout.base import check_weights_version

try:  # verl's default worker group; the local backend runs without Ray installed (a lent GPU machine)
    from rlvr.single_controller import RayWorkerGroup
except ModuleNotFoundError as err:
    if err.name != "ray":
        raise
    RayWorkerGroup = None

__all__ = ["RayPPOTrainer", "ResourcePoolManager", "Role", "apply_kl_penalty", "compute_advantage",
           "compute_response_mask", "compute_spec_decode_metrics"]

logger = logging.getLogger(__name__)

PROMPT_KEYS = ["input_ids", "attention_mask", "position_ids"]


@contextmanager
def _timer(name: str, timing: dict[str, float]) -> Iterator[None]:
    """Add the wall time of the block to ``timing[name]``; a failure inside names the stage."""
    start = time.perf_counter()
    try:
        yield
    except Exception as err:
        err.add_note(f"(raised during the trainer stage '{name}')")
        raise
    finally:
        timing[name] = timing.get(name, 0.0) + time.perf_counter() - start


class RayPPOTrainer(ValidationMixin, DriverStateMixin, FrozenRolesMixin):
    """Distributed PPO-family trainer (PPO with GAE, GRPO, RLOO, REINFORCE++, ReMax, DAPO, EGPO, ...).

    Args:
        config: the run config (``RlvrConfig`` or its ``DictConfig``); validated here.
        tokenizer: tokenizer of the policy (decoding, pad/EOS ids).
        role_worker_mapping: ``Role`` -> worker class; needs ``Role.ActorRollout`` (or
            ``Role.ActorRolloutRef``), ``Role.Critic`` with a critic, ``Role.RefPolicy`` when a
            reference is needed and the actor does not provide it (LoRA), ``Role.Rollout`` for a
            rollout apart from the actor (``actor_rollout_ref.hybrid_engine=false``).
        resource_pool_manager: pools and role -> pool mapping.
        ray_worker_group_cls: ``RayWorkerGroup`` or ``LocalWorkerGroup``.
        processor: the model's multimodal processor (``rlvr.utils.tokenizer.hf_processor``; None for a
            text-only model): the datasets render and tokenise rows with images through it.
        reward_fn: training reward manager (``compute_reward(data, reward_fn)``); None when
            ``reward.routes`` is set (the trainer then routes rewards, see :mod:`rlvr.reward.routing`).
        val_reward_fn: validation reward manager; None disables validation (with routes: validation
            runs when there is validation data).
        train_dataset, val_dataset: datasets; default built from ``data.train_files`` / ``val_files``.
        collate_fn: batch collation (default :func:`rlvr.trainer.data.collate_fn`).
        train_sampler: item order (default: seeded shuffle, ``data.seed``).
        device_name: ``"cpu"`` / ``"cuda"``; default from ``trainer.device``.
    """

    def __init__(self, config, tokenizer, role_worker_mapping: dict[Role, type], resource_pool_manager:
                 ResourcePoolManager, ray_worker_group_cls: type = RayWorkerGroup, processor=None,
                 reward_fn=None, val_reward_fn=None, train_dataset=None, val_dataset=None, collate_fn=None,
                 train_sampler=None, device_name=None) -> None:
        if ray_worker_group_cls is None:
            raise ConfigError("trainer.backend", "Ray is not installed here: pass ray_worker_group_cls=LocalWorkerGroup "
                              "and use trainer.backend=local, or install ray")
        self.config = to_config(config)
        validate_config(self.config, require_data_files=train_dataset is None)
        self.routes_rewards = check_reward_functions(self.config, reward_fn, val_reward_fn)
        self.tokenizer = tokenizer
        self.processor = processor
        self.role_worker_mapping = role_worker_mapping
        self.resource_pool_manager = resource_pool_manager
        self.ray_worker_group_cls = ray_worker_group_cls
        self.reward_fn, self.val_reward_fn = reward_fn, val_reward_fn
        self.device_name = device_name or _resolve_device(self.config.trainer.device)
        self.use_reference = use_reference(self.config)
        self.ref_in_actor = reference_in_actor(self.config)
        self.use_critic = bool(self.config.critic.enable)
        self.rollout_apart = rollout_apart(self.config)
        self.rollout_correction = rollout_correction_config(self.config)
        self.prox_from_update = prox_log_prob_from_update(
            self.config, get_adv_estimator_needs(self.config.algorithm.adv_estimator).reads_old_log_prob)
        self.rollout_moe_metrics = RolloutMoELoadBalanceMetricsAccumulator(self.config.actor_rollout_ref.model)
        self._check_roles()
        self.kl_ctrl_in_reward = (get_kl_controller(self.config.algorithm.kl_ctrl)
                                  if self.config.algorithm.use_kl_in_reward else None)
        self._create_dataloader(train_dataset, val_dataset, collate_fn or default_collate_fn, train_sampler)
        if self.config.trainer.val_only and self.val_dataset is None:
            raise ConfigError("trainer.val_only", "validating only needs validation data: set data.val_files or pass "
                              "val_dataset (or trainer.val_only=false)")
        if self.routes_rewards:  # datasets built from data files were checked with the config
            check_data_routes(self.config, train_dataset, val_dataset)
        self.reward_workers: RestartableGroup | None = None  # over a RewardWorkerGroups
        resolve_save_paths(self.config)  # before the workers get the config
        self.profiling = StepProfiler(self.config, self.device_name)
        self.run_dir = Path(self.config.trainer.default_local_dir)
        self.checkpoints = RunCheckpoints(self.run_dir / "checkpoints",
                                          checkpoints_to_keep(self.config.trainer, self.use_critic))
        self.global_steps = 0
        self.workers = TrainerWorkerGroups(resource_pool_manager, ray_worker_group_cls,
                                           self.config.trainer.call_timeout_s)
        self.metrics_history: list[dict[str, float]] = []
        self.val_generations: list[dict[str, Any]] = []
        self.recovers = self.config.trainer.backend == "ray"
        self.recovery = Recovery(self.config.trainer.max_restarts)
        self._start_state: dict[str, Any] | None = None  # driver state at step 0 of a fresh run
        self.stop = GracefulStop()
        self.rollout_wg: Any = None  # the group that generates: the actor's, or a rollout group apart
        self.async_rollout = AsyncRollout(
            self.config, self.train_iter, lambda batch: self._generate(batch, validate=False), lambda: self.rollout_wg,
            lambda on_device: self.actor_rollout_wg.get_actor_weights(on_device=on_device)[0], ROLLOUT_GROUP
        ) if self.rollout_apart else None

    # ------------------------------------------------------------------ setup
    def _check_roles(self) -> None:
        mapping = self.role_worker_mapping
        if self._actor_role() not in mapping:
            raise ConfigError("role_worker_mapping", "needs Role.ActorRollout (the hybrid actor/rollout worker)")
        if self.use_critic and Role.Critic not in mapping:
            raise ConfigError("critic.enable", "a critic is enabled but role_worker_mapping has no Role.Critic; "
                              "add the critic worker or set critic.enable=False")
        if self.rollout_apart and Role.Rollout not in mapping:
            raise ConfigError("actor_rollout_ref.hybrid_engine", "a rollout apart from the actor (hybrid_engine=false) "
                              "needs Role.Rollout in role_worker_mapping (the worker class of the rollout workers)")
        if self.use_reference and not self.ref_in_actor and Role.RefPolicy not in mapping:
            raise ConfigError("actor_rollout_ref.actor.use_kl_loss", "a KL term (use_kl_loss or use_kl_in_reward) "
                              "needs a reference policy: add Role.RefPolicy to role_worker_mapping, train the "
                              "actor with LoRA (the actor then provides it), or turn the KL term off")
        self._check_frozen_roles()

    def _actor_role(self) -> Role:
        return Role.ActorRolloutRef if Role.ActorRolloutRef in self.role_worker_mapping else Role.ActorRollout

    def _create_dataloader(self, train_dataset, val_dataset, collate_fn, train_sampler) -> None:
        data = self.config.data
        if train_dataset is None:
            train_dataset = create_rl_dataset(data.train_files, data, self.tokenizer, self.processor, is_train=True)
        if val_dataset is None and data.val_files is not None:
            val_dataset = create_rl_dataset(data.val_files, data, self.tokenizer, self.processor, is_train=False,
                                            max_samples=data.val_max_samples)
        self.train_dataset, self.val_dataset, self.collate_fn = train_dataset, val_dataset, collate_fn
        sampler = train_sampler if train_sampler is not None else create_rl_sampler(data, train_dataset)
        self.train_iter = StatefulBatchIterator(train_dataset, data.train_batch_size, sampler, collate_fn)
        steps = len(self.train_iter) * self.config.trainer.total_epochs
        if self.config.trainer.total_training_steps is not None:
            steps = self.config.trainer.total_training_steps
        self.total_training_steps = steps
        self.config.actor_rollout_ref.actor.optim.total_training_steps = steps
        self.config.critic.optim.total_training_steps = steps

    def create_reward_worker_groups(self) -> None:
        """Start the reward worker groups that ``reward.routes`` names, as one stateless group
        (:meth:`add_stateless_group`: a dead or hung reward worker restarts them alone, training is
        not rolled back), and route the training and validation rewards through them."""
        cfg, backend = self.config, self.resource_pool_manager.backend
        if routed_worker_names(cfg):  # routes to reward managers or the reward model alone need no worker group
            self.reward_workers = self.add_stateless_group("reward workers", lambda: RewardWorkerGroups(cfg, backend),
                                                           None)
        self.reward_fn, self.val_reward_fn = reward_routers(cfg, self.tokenizer, self.reward_workers,
                                                            self.val_dataset is not None)

    def init_workers(self) -> None:
        """Create the resource pools, one colocated worker group per pool, spawn the role groups
        and initialise the models (critic and reference first, the actor last); with
        ``reward.routes``, the reward worker groups first. On the Ray backend a worker that dies or
        hangs while starting counts as a failure like one during training (``trainer.max_restarts``):
        every group is torn down and the start is tried again."""
        self._with_worker_restarts(self._start_workers, self._restart_workers)

    def _start_workers(self) -> None:
        """:meth:`init_workers` without the retries (the reward worker groups are started once: a
        restart starts them again with the other stateless groups)."""
        if self.routes_rewards and self.reward_fn is None:
            self.create_reward_worker_groups()
        cfg = self.config
        actor_role = ("actor" if self.rollout_apart else "actor_rollout") + ("_ref" if self.ref_in_actor else "")
        roles: dict[str, tuple[Role, ClassWithInitArgs]] = {
            "actor_rollout": (self._actor_role(), ClassWithInitArgs(
                self.role_worker_mapping[self._actor_role()], config=cfg, role=actor_role))}
        if self.use_critic:
            roles["critic"] = (Role.Critic, ClassWithInitArgs(self.role_worker_mapping[Role.Critic], config=cfg))
        if self.use_reference and not self.ref_in_actor:
            roles["ref"] = (Role.RefPolicy, ClassWithInitArgs(
                self.role_worker_mapping[Role.RefPolicy], config=cfg, role="ref"))
        roles.update(self._frozen_roles())
        groups = self.workers.start(roles)
        self.worker_groups = groups
        self.critic_wg = groups.get("critic")
        self.ref_policy_wg = groups["actor_rollout"] if self.ref_in_actor else groups.get("ref")
        self.actor_rollout_wg = groups["actor_rollout"]
        self._keep_frozen_groups(groups)
        for name in ("critic", "ref", "rm", "teacher", "actor_rollout"):
            if name in groups:
                groups[name].init_model()
        if not self.rollout_apart:
            self.rollout_wg = self.actor_rollout_wg
        elif self.rollout_wg is None:  # started once; a full restart starts it again (restart_stateless)
            worker_cls = self.role_worker_mapping[Role.Rollout]
            self.rollout_wg = self.add_stateless_group(ROLLOUT_GROUP, lambda: start_rollout_group(
                cfg, self.resource_pool_manager, worker_cls, self.async_rollout.resend_weights), worker_cls)

    def add_stateless_group(self, name: str, create: Callable[[], Any], worker_cls: type | None) -> RestartableGroup:
        """Start a group of workers without training state (reward workers, an LLM judge) that is
        restarted alone when a worker dies or hangs (:class:`~rlvr.trainer.recovery.RestartableGroup`).
        ``create`` starts and initialises it, again at every restart (take the pool from
        ``self.resource_pool_manager`` inside it: a full restart replaces the pools)."""
        return self.workers.add_stateless(name, create, worker_cls, self.recovery, lambda: self.global_steps)

    def shutdown(self) -> None:
        """Stop the workers and give the Ray placement groups back, so that another trainer can
        start in the same Ray session."""
        self.workers.shutdown()

    # ------------------------------------------------------------------ the loop
    def fit(self) -> None:
        """Train until ``total_training_steps`` or ``trainer.max_time_s``; validate, checkpoint,
        export and write the report on the configured schedule. A dead or hung worker is recovered
        from (Ray backend); a stop signal ends training after the current step with a checkpoint
        (then ``self.stop.requested`` is set)."""
        cfg = self.config.trainer
        resumed_from = self._with_worker_restarts(self._load_checkpoint, self._restart_and_load_checkpoint)
        if resumed_from is None:
            self._start_state = self._driver_state()
        progress = TrainingProgress(self.total_training_steps, self.global_steps, cfg.max_time_s, cfg.progress_bar)
        self.tracker = Tracking(cfg.project_name, cfg.experiment_name, list(cfg.logger), self.run_dir,
                                OmegaConf.to_container(self.config, resolve=True), resume_step=resumed_from,
                                console_write=progress.write)
        self._last_val_step = self._last_save_step = self.global_steps
        self._val_before_train_due = self.val_reward_fn is not None and cfg.val_before_train and self.global_steps == 0
        if cfg.val_only:
            self._validate_only(progress)
            return
        with self.stop:
            try:
                self._run_with_recovery(progress)
            finally:
                progress.close()
                self.tracker.finish()
                if self.async_rollout is not None:
                    self.async_rollout.close()
        self.profiling.finish()
        if cfg.report:
            self._write_report(progress.elapsed_s())

    def _validate_only(self, progress: TrainingProgress) -> None:
        """``trainer.val_only``: one validation at the current step (0, or the resumed checkpoint's),
        logged, then the run ends: no training, checkpoint, export or report."""
        if self.val_reward_fn is None:
            raise ConfigError("trainer.val_only", "validating only needs a validation reward function: pass "
                              "val_reward_fn (or trainer.val_only=false)")
        try:
            self._log(self._validate(), step=self.global_steps)
        finally:
            progress.close()
            self.tracker.finish()
            if self.async_rollout is not None:
                self.async_rollout.close()

    def _run_with_recovery(self, progress: TrainingProgress) -> None:
        """:meth:`_run`, restarted from the last whole checkpoint after each recoverable failure."""
        while True:
            try:
                with self.async_rollout.running() if self.async_rollout is not None else nullcontext():
                    return self._run(progress)
            except RECOVERABLE_ERRORS if self.recovers else () as error:
                if self.stop.requested:
                    raise  # stopping anyway: a resume starts from the last whole checkpoint
                self._recover(error, progress)

    def _run(self, progress: TrainingProgress) -> None:
        """Steps from ``global_steps`` on, then the final validation, checkpoint and export."""
        cfg = self.config.trainer
        if self._val_before_train_due:
            self._log(self._validate(), step=0)
            progress.restart_clock()  # max_time_s budgets the training loop
            self._val_before_train_due = False
        while self.global_steps < self.total_training_steps and not progress.out_of_time() and not self.stop.requested:
            self.global_steps += 1
            self.profiling.start(self._profiled_groups(), self.global_steps)
            metrics = self._train_step()
            is_last = self.global_steps >= self.total_training_steps or progress.out_of_time()
            self.profiling.stop(self._profiled_groups(), self.global_steps, is_last)
            if self.val_reward_fn is not None and cfg.test_freq > 0 and self.global_steps % cfg.test_freq == 0:
                started = time.perf_counter()
                metrics.update(self._validate())
                metrics["timing_s/testing"] = time.perf_counter() - started
                self._last_val_step = self.global_steps
            if cfg.save_freq > 0 and self.global_steps % cfg.save_freq == 0 and not is_last:
                started = time.perf_counter()
                self._save_checkpoint()
                metrics["timing_s/save_checkpoint"] = time.perf_counter() - started
            metrics.update(self.recovery.metrics())
            self._log(metrics, step=self.global_steps)
            progress.update(metrics["timing_s/step"], metrics)
        if not self.stop.requested and self.val_reward_fn is not None and self._last_val_step != self.global_steps:
            self._log(self._validate(), step=self.global_steps)
            self._last_val_step = self.global_steps
        if self._last_save_step != self.global_steps:
            self._save_checkpoint()
        if cfg.export_hf and not self.stop.requested:
            self.actor_rollout_wg.export_hf(str(self.run_dir / "hf_model"))

    def _profiled_groups(self) -> list[Any]:
        """The worker groups whose roles ``global_profiler`` may profile: the actor's (rollout and
        reference when they share it), a separate reference's and the critic's."""
        groups = [self.actor_rollout_wg, self.ref_policy_wg, self.critic_wg]
        return [group for i, group in enumerate(groups)
                if group is not None and all(group is not earlier for earlier in groups[:i])]

    def _log(self, metrics: dict[str, float], step: int) -> None:
        self.metrics_history.append({"step": step, **metrics})
        self.tracker.log(metrics, step=step)

    def _train_step(self) -> dict[str, float]:
        """One PPO step; returns its metrics (``train/skipped_step`` = 1 when dynamic sampling
        found no informative group, so nothing was trained)."""
        timing: dict[str, float] = {}
        metrics: dict[str, float] = {}
        with _timer("step", timing):
            batch = self._collect_batch(timing, metrics)
            if batch is not None:
                self._train_on_batch(batch, timing, metrics)
        if batch is None:
            return {**metrics, "train/skipped_step": 1.0, **{f"timing_s/{k}": v for k, v in timing.items()}}
        if self.config.trainer.rollout_data_dir:
            with _timer("dump_rollout_generations", timing):
                dump_batch(batch, self.tokenizer, self.config.trainer.rollout_data_dir, self.global_steps)
        batch.meta_info["global_token_num"] = batch.batch["attention_mask"].sum(-1).tolist()
        metrics.update(compute_data_metrics(batch, self.use_critic))
        metrics.update(compute_variance_proxy_metrics(batch, metrics.get("actor/grad_norm")))
        metrics.update(per_source_metrics("train", batch.non_tensor_batch["data_source"],
                                          batch.batch["token_level_scores"].sum(-1).tolist(),
                                          batch.non_tensor_batch["acc"].tolist()))
        metrics.update(_tool_use_metrics("train", batch))
        metrics.update(compute_timing_metrics(batch, timing))
        metrics.update(compute_throughout_metrics(batch, timing, world_size(self.config)))
        return metrics

    def _train_on_batch(self, batch: DataProto, timing: dict[str, float], metrics: dict[str, float]) -> None:
        """Balanced over the ranks, log-probs, reference, values, advantages, then the critic and actor updates."""
        if self.config.trainer.balance_batch:
            self._balance_batch(batch, metrics)
        self._compute_old_log_prob(batch, timing, metrics)
        if self.use_reference:
            self._compute_ref_log_prob(batch, timing)
        if self.use_critic:
            self._compute_values(batch, timing)
        if self.teacher_wg is not None:
            with _timer("teacher", timing):
                metrics.update(self._add_teacher_scores(batch))
        self._compute_advantage(batch, timing, metrics)
        if self.use_critic:
            self._update_critic(batch, timing, metrics)
        if self.global_steps > self.config.trainer.critic_warmup:
            self._update_actor(batch, timing, metrics)

    # ------------------------------------------------------------------ stages
    def _balance_batch(self, batch: DataProto, metrics: dict[str, float], logging_prefix: str = "global_seqlen") -> None:
        """``trainer.balance_batch`` (verl's method): reorder ``batch`` in place so that every data-parallel
        rank gets about the same tokens, each row within its mini-batch (:mod:`rlvr.trainer.ppo.balance`);
        nothing to do with one rank."""
        layouts = update_layouts(self.config, self.use_critic)
        if layouts[0].dp_size > 1:
            keep_groups = get_adv_estimator_needs(self.config.algorithm.adv_estimator).needs_groups
            metrics.update(balance_batch(batch, layouts, keep_groups, logging_prefix))

    def _collect_batch(self, timing: dict[str, float], metrics: dict[str, float]) -> DataProto | None:
        """Generate and score prompts. With ``filter_groups`` (DAPO) keep only informative groups
        and generate more until ``train_batch_size`` groups are kept; after ``max_num_gen_batches``
        train on the groups kept so far (``train/filter_groups_incomplete`` = 1), trimmed so that
        their rows split evenly over the workers; None when no group was kept. The score and accuracy
        of all generated samples, before filtering, are ``train/unfiltered_score_mean`` and
        ``train/unfiltered_acc`` (``critic/score/*`` and ``train/acc`` describe the trained batch)."""
        fg = self.config.algorithm.filter_groups
        n, wanted = self.config.actor_rollout_ref.rollout.n, self.config.data.train_batch_size
        if not fg.enable:
            return self._generate_and_score(timing, metrics, tag="0")
        kept = GroupAccumulator(fg.metric)
        num_gen = 0
        while kept.num_groups < wanted and (fg.max_num_gen_batches == 0 or num_gen < fg.max_num_gen_batches):
            kept.add(self._generate_and_score(timing, metrics, tag=str(num_gen)))
            num_gen += 1
        metrics["train/num_gen_batches"] = float(num_gen)
        metrics["train/kept_group_ratio"] = kept.num_groups / max(kept.num_seen_groups, 1)
        metrics["train/filter_groups_incomplete"] = float(kept.num_groups < wanted)
        metrics["train/unfiltered_score_mean"] = float(np.mean(kept.seen_scores))
        metrics["train/unfiltered_acc"] = float(np.mean(kept.seen_acc))
        usable = min(kept.num_groups, wanted)
        workers = world_size(self.config)
        while usable > 0 and (usable * n) % workers:
            usable -= 1
        return kept.take(usable, n) if usable else None

    def _generate_and_score(self, timing: dict[str, float], metrics: dict[str, float], tag: str) -> DataProto:
        """Draw a batch of prompts (uid ``<step>-<tag>-<i>``), generate ``rollout.n`` responses each
        (plus a greedy response per prompt, scored, when the estimator's registry entry needs a greedy
        baseline, e.g. ReMax) and score them; worker and reward metrics go to ``metrics``. A rollout
        apart from the actor has generated them already: they come from its schedule."""
        n = self.config.actor_rollout_ref.rollout.n
        greedy_baseline = get_adv_estimator_needs(self.config.algorithm.adv_estimator).needs_greedy_baseline
        with _timer("gen", timing):
            if self.async_rollout is not None:
                batch = self.async_rollout.next_batch()
            else:
                batch = DataProto.from_single_dict(next(self.train_iter))
                batch.non_tensor_batch["uid"] = np.array([f"{self.global_steps}-{tag}-{i}" for i in range(len(batch))],
                                                         dtype=object)
                repeated = batch.repeat(n, interleave=True)  # before the baseline's rollout takes the prompts
                if greedy_baseline:
                    baseline = self._generate(batch, validate=False, do_sample=False)
                batch = self._generate(repeated, validate=False)
        metrics.update(reduce_metrics(batch.meta_info.pop("metrics", {})))
        metrics.update(compute_moe_lb_metrics(batch, self.config.actor_rollout_ref.rollout.moe_load_balance_metrics_interval,
                                              self.global_steps, self.rollout_moe_metrics))  # rollout/moe/*
        with _timer("reward", timing):
            metrics.update(self._score(batch, self.reward_fn))
            if greedy_baseline:
                self._score(baseline, self.reward_fn)
                baseline_scores = baseline.batch["token_level_scores"].sum(-1)
                batch.batch["reward_baselines"] = baseline_scores.repeat_interleave(n)
        return batch

    def _generate(self, batch: DataProto, validate: bool, do_sample: bool | None = None) -> DataProto:
        """``batch`` (prompts; its prompt tensors are moved to the rollout input) united with the
        rollout's output. The rows' non-tensor fields go along: agent loops read ``agent_name``, tool
        kwargs and, for environments, the ground truth. The images move into the rollout and come back
        with it: an agent loop may add the images of a conversation (an environment's observations)."""
        images = [key for key in (MULTI_MODAL_INPUTS, MULTI_MODAL_DATA) if key in batch.non_tensor_batch]
        gen_input = batch.pop(batch_keys=PROMPT_KEYS, non_tensor_batch_keys=images)
        gen_input.non_tensor_batch = {**batch.non_tensor_batch, **gen_input.non_tensor_batch}
        gen_input.meta_info = {"eos_token_id": self.tokenizer.eos_token_id, "pad_token_id": self.tokenizer.pad_token_id,
                               "validate": validate, "global_steps": self.global_steps}
        if do_sample is not None:
            gen_input.meta_info["do_sample"] = do_sample
        output = self.rollout_wg.generate_sequences(gen_input)
        check_weights_version(output.meta_info)
        output.meta_info.pop("timing", None)  # per-call worker timing; the trainer times its stages itself
        generated = output.select(batch_keys=list(output.batch.keys()))
        generated.meta_info = output.meta_info  # keeps rollout_weights_version etc. for compute_log_prob
        return batch.union(generated)

    def _score(self, batch: DataProto, reward_fn: Any) -> dict[str, float]:
        """``token_level_scores``, per-sample ``acc`` and the reward function's per-sample extras
        (column ``reward_extra_info``, a dict per sample) into ``batch``; returns the reward metrics.
        ``acc`` is the task scorer's verdict alone: tool and environment rewards of a multi-turn
        rollout (``turn_scores``) are added to the scores after it, so they never make an answer right."""
        rm_metrics = self._add_rm_scores(batch)
        reward_tensor, extra = compute_reward(batch, reward_fn)
        for key in self.config.algorithm.gdpo_reward_keys or ():  # GDPO's reward components, per sample
            if key in extra:
                batch.non_tensor_batch[key] = np.array(extra[key], dtype=object)
        acc = sample_accuracy(reward_tensor.sum(-1), extra)
        if "turn_scores" in batch.batch.keys():  # rewards of tools / environments during a multi-turn rollout
            reward_tensor = reward_tensor + batch.batch["turn_scores"]
        batch.batch["token_level_scores"] = reward_tensor
        batch.non_tensor_batch["acc"] = np.array(acc.tolist(), dtype=object)
        extras = np.empty(len(batch), dtype=object)
        extras[:] = [{key: values[i] for key, values in extra.items()} for i in range(len(batch))]
        batch.non_tensor_batch[REWARD_EXTRA_INFO] = extras
        return {**rm_metrics, **reduce_metrics(batch.meta_info.pop("metrics", {}))}

    def _compute_old_log_prob(self, batch: DataProto, timing: dict[str, float], metrics: dict[str, float]) -> None:
        """``old_log_probs`` from the actor (the worker reuses the rollout's sampling log-probs when
        they are exact for the current weights), the rollout/actor mismatch metrics and the rollout
        correction (both need the rollout's log-probs: ``rollout.calculate_log_probs``).
        ``actor/entropy`` is the Monte-Carlo estimate ``mean(-log p)`` of the sampled tokens, unless
        the worker returned per-token ``entropys`` (asked for with ``actor.calculate_entropy``)."""
        rc = self.rollout_correction
        if rc.bypass_mode:
            metrics.update(bypass_old_log_probs(batch, rc))
            return
        if self.prox_from_update:  # decoupled PPO, one optimizer step: the update's forward is the proximal policy
            batch.meta_info[PROX_FROM_UPDATE_KEY] = prox_from_update_settings(rc)
            return
        if self.config.actor_rollout_ref.actor.calculate_sum_pi_squared:
            batch.meta_info["calculate_sum_pi_squared"] = True
        batch.meta_info["calculate_entropy"] = bool(self.config.actor_rollout_ref.actor.calculate_entropy)
        with _timer("old_log_prob", timing):
            output = self.actor_rollout_wg.compute_log_prob(batch)
        mask = batch.batch["response_mask"]
        batch.batch["old_log_probs"] = output.batch["old_log_probs"]
        if ROUTED_EXPERTS in output.batch.keys():  # an MoE actor's own routes (router_replay.mode=R2)
            batch.batch[ROUTED_EXPERTS] = output.batch[ROUTED_EXPERTS]
        if "sum_pi_squared" in output.batch.keys():
            batch.batch["sum_pi_squared"] = output.batch["sum_pi_squared"]
        metrics.update(reduce_metrics(output.meta_info["metrics"]))
        if "entropys" in output.batch.keys():
            loss_agg_mode = self.config.actor_rollout_ref.actor.loss_agg_mode
            metrics["actor/entropy"] = agg_loss(output.batch["entropys"], mask, loss_agg_mode).item()
        else:
            metrics["actor/entropy"] = masked_mean(-output.batch["old_log_probs"], mask).item()
        if "rollout_log_probs" in batch.batch.keys():
            metrics.update(compute_rollout_mismatch_metrics(batch.batch["old_log_probs"],
                                                             batch.batch["rollout_log_probs"], mask,
                                                             rc.log_prob_diff_threshold))
            metrics.update(compute_rollout_correction_and_add_to_batch(batch, rc)[1])

    def _compute_ref_log_prob(self, batch: DataProto, timing: dict[str, float]) -> None:
        with _timer("ref", timing):
            output = self.ref_policy_wg.compute_ref_log_prob(batch)
        batch.batch["ref_log_prob"] = output.batch["ref_log_prob"]

    def _compute_values(self, batch: DataProto, timing: dict[str, float]) -> None:
        with _timer("values", timing):
            output = self.critic_wg.compute_values(batch)
        batch.batch["values"] = output.batch["values"]

    def _compute_advantage(self, batch: DataProto, timing: dict[str, float], metrics: dict[str, float]) -> None:
        """KL penalty in the reward (if enabled), then the registered estimator on the driver."""
        algo = self.config.algorithm
        with _timer("adv", timing):
            if self.kl_ctrl_in_reward is not None:
                metrics.update(apply_kl_penalty(batch, self.kl_ctrl_in_reward, algo.kl_penalty)[1])
            else:
                batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
            compute_advantage(batch, algo.adv_estimator, gamma=algo.gamma, lam=algo.lam,
                              norm_adv_by_std_in_grpo=algo.norm_adv_by_std_in_grpo, config=algo)

    def _update_critic(self, batch: DataProto, timing: dict[str, float], metrics: dict[str, float]) -> None:
        with _timer("update_critic", timing):
            output = self.critic_wg.update_critic(batch)
        metrics.update(reduce_metrics(output.meta_info["metrics"]))

    def _update_actor(self, batch: DataProto, timing: dict[str, float], metrics: dict[str, float]) -> None:
        """The actor update, then the new weights into the rollout engine (in place, own stage)."""
        with _timer("update_actor", timing):
            output = self.actor_rollout_wg.update_actor(batch)
        metrics.update(reduce_metrics(output.meta_info["metrics"]))
        with _timer("update_weights", timing):
            if self.async_rollout is None:
                stages = self.actor_rollout_wg.update_weights()[0]
                metrics.update({f"timing_s/update_weights/{stage}": seconds for stage, seconds in stages.items()})
            else:
                self.async_rollout.after_update()


def _tool_use_metrics(prefix: str, batch: DataProto) -> dict[str, float]:
    """Tool use among the batch's samples and correct answers (multi-turn rollouts only)."""
    if "num_tool_calls" not in batch.non_tensor_batch:
        return {}
    return tool_use_metrics(prefix, batch.non_tensor_batch["acc"].tolist(), batch.non_tensor_batch["num_tool_calls"].tolist())


def _resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device
