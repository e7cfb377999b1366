"""Entry point of a training run: ``python -m rlvr.trainer.main_ppo [--preset NAME] key=value ...``
(also the ``rlvr`` console command).

Loads and validates the whole config before anything starts, then builds the tokenizer, the
reward managers, the role -> worker mapping and resource pools, the datasets and the
:class:`~rlvr.trainer.ppo.ray_trainer.RayPPOTrainer`, and runs ``init_workers(); fit()``.

Example (GRPO on the embedded SmolLM2-135M-Instruct, CPU, in-process workers)::

    python -m rlvr.trainer.main_ppo --preset grpo trainer.backend=local trainer.device=cpu \\
        data.train_files=data/arith/train.jsonl data.val_files=data/arith/test.jsonl
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
import ray
from omegaconf import DictConfig

from rlvr.single_controller import get_worker_group_cls, init_ray
from rlvr.trainer.config import help_config, list_presets, load_config, use_reference, validate_config
from rlvr.trainer.ppo.ray_trainer import RayPPOTrainer, ResourcePoolManager, Role
from rlvr.trainer.ppo.reward import load_reward_manager
from rlvr.utils.errors import RlvrError
from rlvr.utils.seed import set_seed
from rlvr.utils.tokenizer import hf_tokenizer

GLOBAL_POOL = "global_pool"


def build_role_worker_mapping(cfg: DictConfig) -> tuple[dict[Role, type], dict[Role, str]]:
    """Worker classes per role and the pool of each role (every role shares one pool, colocated)."""
    from rlvr.workers.engine_workers import ActorRolloutRefWorker, CriticWorker

    role_worker_mapping: dict[Role, type] = {Role.ActorRollout: ActorRolloutRefWorker}
    if cfg.critic.enable:
        role_worker_mapping[Role.Critic] = CriticWorker
    if use_reference(cfg) and cfg.actor_rollout_ref.model.lora_rank == 0:
        role_worker_mapping[Role.RefPolicy] = ActorRolloutRefWorker
    return role_worker_mapping, {role: GLOBAL_POOL for role in role_worker_mapping}


def _uses_gpu(cfg: DictConfig) -> bool:
    if cfg.trainer.device == "auto":
        import torch

        return torch.cuda.is_available()
    return cfg.trainer.device == "cuda"


def run_ppo(cfg: DictConfig) -> RayPPOTrainer:
    """Run a validated config end to end; returns the (shut down) trainer, whose
    ``metrics_history`` holds the logged metrics. Ray is started and stopped here for
    ``trainer.backend=ray`` unless it was already running."""
    set_seed(cfg.trainer.seed)
    model = cfg.actor_rollout_ref.model
    tokenizer = hf_tokenizer(model.tokenizer_path or model.path, trust_remote_code=model.trust_remote_code)
    use_gpu = _uses_gpu(cfg)
    workers = cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node
    started_ray = False
    if cfg.trainer.backend == "ray" and not ray.is_initialized():
        init_ray(num_cpus=None if use_gpu else max(workers, 1))
        started_ray = True
    try:
        role_worker_mapping, mapping = build_role_worker_mapping(cfg)
        spec = {GLOBAL_POOL: [cfg.trainer.n_gpus_per_node] * cfg.trainer.nnodes}
        pools = ResourcePoolManager(resource_pool_spec=spec, mapping=mapping, use_gpu=use_gpu,
                                    backend=cfg.trainer.backend)
        reward_fn = val_reward_fn = None  # with reward.routes the trainer routes rewards through reward workers
        if not cfg.reward.routes:
            reward_fn = load_reward_manager(cfg, tokenizer, num_examine=cfg.reward_model.num_examine)
            val_reward_fn = load_reward_manager(cfg, tokenizer, num_examine=0) if cfg.data.val_files else None
        trainer = RayPPOTrainer(cfg, tokenizer, role_worker_mapping, pools,
                                ray_worker_group_cls=get_worker_group_cls(cfg.trainer.backend),
                                reward_fn=reward_fn, val_reward_fn=val_reward_fn,
                                device_name="cuda" if use_gpu else "cpu")
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
    parser.add_argument("--help-config", action="store_true", help="print every config key with its help and exit")
    parser.add_argument("--print-config", action="store_true", help="print the final config and exit")
    parser.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. algorithm.adv_estimator=grpo")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The ``rlvr`` command; returns the exit code (2 for a config error)."""
    args = build_parser().parse_args(argv)
    if args.help_config:
        sys.stdout.write(help_config())
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_config(args.preset, args.overrides)
        validate_config(cfg)
    except RlvrError as err:
        print(f"rlvr: {err}", file=sys.stderr)
        return 2
    if args.print_config:
        from omegaconf import OmegaConf

        sys.stdout.write(OmegaConf.to_yaml(cfg))
        return 0
    run_ppo(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
