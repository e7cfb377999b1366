"""Entry point of a training run: ``python -m rlvr.trainer.main_ppo [--preset NAME] key=value ...``
(also the ``rlvr`` console command).

The command loads and checks the whole config before it imports torch, Ray or transformers (which
take seconds), so a wrong key, value or batch size is reported at once, with a suggestion for a
misspelt key. A config that names the user's own code (``trainer.user_modules``, or an object path
``pkg.module:Name`` where a registry name goes) imports it first and checks the names against the
registries, which then hold the user's registrations. It then prints the derived settings (prompts and samples per step, optimizer steps
per rollout, micro-batches per rank, token budget, where each role runs), builds the tokenizer,
the reward managers, the role -> worker mapping and resource pools, the datasets and the
:class:`~rlvr.trainer.ppo.ray_trainer.RayPPOTrainer`, and runs ``init_workers(); fit()``.
SIGINT/SIGTERM stop after the current step with a checkpoint; the command prints how to resume.
Worker failures that end the run (past ``trainer.max_restarts``, a worker error a restart does not
cure, a worker lost while stopping) print the error, the newest whole checkpoint and the same
resume command, and exit with 1.

Example (GRPO on the embedded SmolLM2-135M-Instruct, CPU, in-process workers)::

    python -m rlvr.trainer.main_ppo --preset grpo trainer.backend=local trainer.device=cpu \\
        data.train_files=data/arith/train.jsonl data.val_files=data/arith/test.jsonl
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from rlvr.trainer.config import (check_config, check_names, help_config, list_presets, load_config, use_reference,
                                 validate_config)
from rlvr.trainer.config.async_checks import rollout_apart
from rlvr.trainer.config.validate import reference_in_actor, uses_user_code
from rlvr.trainer.config.builtin_names import BUILTIN_NAMES
from rlvr.trainer.graceful_stop import StopNow
from rlvr.trainer.config.validate_models import uses_reward_model
from rlvr.trainer.ppo.utils import Role
from rlvr.trainer.run_settings import describe_run
from rlvr.utils.errors import ConfigError, DataError, WorkerError
from rlvr.workers.megatron.layout import strategy_of

if TYPE_CHECKING:
    from rlvr.trainer.ppo.ray_trainer import RayPPOTrainer

GLOBAL_POOL = "global_pool"


def _worker_classes(strategy: str) -> tuple[type, type]:
    """``(actor/rollout/reference worker, critic worker)`` classes of a training strategy."""
    if strategy == "megatron":
        from rlvr.workers.megatron.workers import MegatronActorRolloutRefWorker, MegatronCriticWorker

        return MegatronActorRolloutRefWorker, MegatronCriticWorker
    from rlvr.workers.engine_workers import ActorRolloutRefWorker, CriticWorker

    return ActorRolloutRefWorker, CriticWorker


def build_role_worker_mapping(cfg: DictConfig) -> tuple[dict[Role, type], dict[Role, str]]:
    """Worker classes per role, by each role's ``strategy`` (FSDP2 or Megatron), and the pool of each
    role: every role shares one pool, colocated, except a rollout apart from the actor
    (``actor_rollout_ref.hybrid_engine=false``), which has a pool of its own."""
    role_worker_mapping: dict[Role, type] = {Role.ActorRollout: _worker_classes(strategy_of(cfg, "actor"))[0]}
    if cfg.critic.enable:
        role_worker_mapping[Role.Critic] = _worker_classes(strategy_of(cfg, "critic"))[1]
    if use_reference(cfg) and not reference_in_actor(cfg):
        role_worker_mapping[Role.RefPolicy] = _worker_classes(strategy_of(cfg, "ref"))[0]
    pool_of_role = {role: GLOBAL_POOL for role in role_worker_mapping}
    if rollout_apart(cfg):  # a rollout-only worker: no training backend
        from rlvr.trainer.async_schedule.placement import ROLLOUT_POOL

        role_worker_mapping[Role.Rollout] = _worker_classes("fsdp")[0]
        pool_of_role[Role.Rollout] = ROLLOUT_POOL
    from rlvr.trainer.ppo.frozen_roles import frozen_role_placement

    frozen_workers, frozen_pools, _ = frozen_role_placement(cfg, GLOBAL_POOL)  # reward model, teacher
    role_worker_mapping.update(frozen_workers)
    pool_of_role.update(frozen_pools)
    return role_worker_mapping, pool_of_role


def _uses_gpu(cfg: DictConfig) -> bool:
    if cfg.trainer.device == "auto":
        import torch

        return torch.cuda.is_available()
    return cfg.trainer.device == "cuda"


def run_ppo(cfg: DictConfig, role_worker_mapping: dict[Role, type] | None = None, reward_fn: Any = None) -> RayPPOTrainer:
    """Run a validated config end to end; returns the (shut down) trainer, whose
    ``metrics_history`` holds the logged metrics. The datasets are read (and checked) before Ray
    starts; Ray is started and stopped here for ``trainer.backend=ray`` unless it was already running.

    Args:
        cfg: the run config.
        role_worker_mapping: worker class per role (default :func:`build_role_worker_mapping`).
        reward_fn: the training reward function (default: the reward manager the config names).
    """
    # Imported here: the command checks the config before paying for torch, Ray and transformers.
    from rlvr.single_controller import get_worker_group_cls
    from rlvr.trainer.async_schedule.placement import rollout_pool_backends, rollout_pool_spec
    from rlvr.reward.reward_model import RewardModelScores
    from rlvr.trainer.ppo.frozen_roles import frozen_role_placement
    from rlvr.trainer.ppo.ray_trainer import RayPPOTrainer, ResourcePoolManager
    from rlvr.trainer.ppo.reward import load_reward_manager
    from rlvr.utils.seed import set_seed
    from rlvr.utils.tokenizer import data_tokenizer

    set_seed(cfg.trainer.seed)
    tokenizer, processor = data_tokenizer(cfg.actor_rollout_ref.model, cfg.data)  # processor None: a text-only model
    use_gpu = _uses_gpu(cfg)
    default_mapping, pool_of_role = build_role_worker_mapping(cfg)
    spec = {GLOBAL_POOL: [cfg.trainer.n_gpus_per_node] * cfg.trainer.nnodes}
    apart = rollout_apart(cfg)
    if apart:
        spec.update(rollout_pool_spec(cfg))
    spec.update(frozen_role_placement(cfg, GLOBAL_POOL)[2])
    pools = ResourcePoolManager(resource_pool_spec=spec, mapping=pool_of_role, use_gpu=use_gpu,
                                backend=cfg.trainer.backend, pool_backends=rollout_pool_backends(cfg) if apart else {})
    val_reward_fn = None  # with reward.routes the trainer routes rewards through reward workers
    if not cfg.reward.routes and uses_reward_model(cfg):  # verl: the reward model alone scores every sample
        reward_fn = reward_fn or RewardModelScores()
        val_reward_fn = RewardModelScores() if cfg.data.val_files else None
    elif not cfg.reward.routes:
        reward_fn = reward_fn or load_reward_manager(cfg, tokenizer, num_examine=cfg.reward_model.num_examine)
        val_reward_fn = load_reward_manager(cfg, tokenizer, num_examine=0) if cfg.data.val_files else None
    trainer = RayPPOTrainer(cfg, tokenizer, role_worker_mapping or default_mapping, pools,
                            ray_worker_group_cls=get_worker_group_cls(cfg.trainer.backend), processor=processor,
                            reward_fn=reward_fn, val_reward_fn=val_reward_fn, device_name="cuda" if use_gpu else "cpu")
    started_ray = False
    if cfg.trainer.backend == "ray":  # the local backend runs without Ray installed
        import ray

        from rlvr.single_controller import init_ray
        from rlvr.trainer.constants_ppo import get_ppo_ray_runtime_env

        if not ray.is_initialized():
            workers = sum(sum(nodes) for nodes in spec.values())
            num_cpus = cfg.ray_kwargs.ray_init.num_cpus  # verl's ray_kwargs.ray_init.num_cpus, else the workers'
            init_ray(num_cpus=num_cpus if num_cpus is not None else None if use_gpu else max(workers, 1),
                     env_vars=get_ppo_ray_runtime_env(cfg)["env_vars"])
            started_ray = True
    try:
        try:
            trainer.init_workers()
            trainer.fit()
        finally:
            trainer.shutdown()
        return trainer
    finally:
        if started_ray:
            ray.shutdown()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlvr", description="Train an LLM with PPO-family RL (GRPO, PPO, RLOO, DAPO, ...).",
        epilog=f"presets: {', '.join(list_presets())}. Example: rlvr --preset grpo "
               "data.train_files=train.jsonl trainer.backend=local")
    parser.add_argument("--preset", default=None, help="a preset name or a YAML file, applied before the overrides")
    parser.add_argument("--config-path", "-cp", "--config-dir", "-cd", dest="config_path", default=None,
                        help="Hydra: the folder of --config-name (absolute, or relative to rlvr/trainer, then to the "
                             "working directory)")
    parser.add_argument("--config-name", "-cn", dest="config_name", default=None,
                        help="Hydra: a YAML config (its defaults: list may build on ppo_trainer / "
                             "ppo_megatron_trainer); default ppo_trainer")
    parser.add_argument("--help-config", action="store_true", help="print every config key with its help and exit")
    parser.add_argument("--print-config", action="store_true", help="print the final config and exit")
    parser.add_argument("--dry-run", action="store_true",
                        help="check the config, print the derived settings and exit (nothing heavy is imported)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides: key=value, +key=value, ++key=value, ~key, "
                                                     "model_engine=megatron, e.g. algorithm.adv_estimator=grpo")
    return parser


def resume_command(argv: Sequence[str]) -> str:
    """The shell command that continues this run from its newest whole checkpoint: the same
    command, from the same directory, with ``trainer.resume_mode=auto``."""
    program = ["rlvr"] if Path(sys.argv[0]).name == "rlvr" else [sys.executable, "-m", "rlvr.trainer.main_ppo"]
    kept = [a for a in argv if not a.startswith(("trainer.resume_mode=", "trainer.resume_from_path="))]
    return f"cd {shlex.quote(os.getcwd())} && {shlex.join([*program, *kept, 'trainer.resume_mode=auto'])}"


def _stopped_message(trainer: RayPPOTrainer, argv: Sequence[str]) -> str:
    where = trainer.checkpoints.last_whole()
    saved = f"the checkpoint of step {trainer.global_steps} is {where}" if where else "no checkpoint was written"
    return (f"rlvr: stopped by {trainer.stop.signal_name} after step {trainer.global_steps}; {saved}.\n"
            f"Resume with:\n  {resume_command(argv)}")


def _worker_failure_message(error: Exception, cfg: DictConfig, argv: Sequence[str]) -> str:
    """What the command prints when worker failures end the run (past ``trainer.max_restarts``, a
    worker error that a restart does not cure, or a worker lost while stopping): the error, the
    newest whole checkpoint on disk and the command that resumes from it."""
    from rlvr.trainer.checkpoint import CheckpointManager

    root = Path(cfg.trainer.default_local_dir) / "checkpoints"
    latest = CheckpointManager(root).latest()
    saved = (f"the last whole checkpoint is {latest}" if latest is not None
             else f"no whole checkpoint is in {root}, so a resume starts from the beginning")
    return f"rlvr: {error}\nThe run ended on a worker failure; {saved}.\nResume with:\n  {resume_command(argv)}"


def main(argv: Sequence[str] | None = None) -> int:
    """The ``rlvr`` command; returns the exit code (2 for a config or data error, 1 when worker
    failures end the run, 128 + the signal number after a stop signal)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.help_config:
        sys.stdout.write(help_config())
        return 0
    try:
        cfg = load_config(args.preset, args.overrides, args.config_name, args.config_path)  # imports the user's modules
        check_config(cfg)  # torch-free: everything but the registry names
        if uses_user_code(cfg):
            validate_config(cfg)  # the names against the registries, which hold the user's registrations
        else:
            check_names(cfg, BUILTIN_NAMES)
    except ConfigError as err:
        print(f"rlvr: {err}", file=sys.stderr)
        return 2
    if args.print_config:
        sys.stdout.write(OmegaConf.to_yaml(cfg))
        return 0
    print(describe_run(cfg), flush=True)
    if args.dry_run:
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from rlvr.trainer.recovery import RestartLimitError  # imports torch: after the config check

    try:
        trainer = run_ppo(cfg)
    except (ConfigError, DataError) as err:
        print(f"rlvr: {err}", file=sys.stderr)
        return 2
    except (WorkerError, RestartLimitError) as err:
        print(_worker_failure_message(err, cfg, argv), file=sys.stderr)
        return 1
    except StopNow as stop:
        print(f"rlvr: {stop}; a resume takes the newest whole checkpoint in "
              f"{Path(cfg.trainer.default_local_dir) / 'checkpoints'}:\n  {resume_command(argv)}", file=sys.stderr)
        return 128 + stop.signum
    if trainer.stop.requested and trainer.global_steps < trainer.total_training_steps:
        print(_stopped_message(trainer, argv), file=sys.stderr)
        return 128 + trainer.stop.signum
    return 0


if __name__ == "__main__":
    sys.exit(main())
