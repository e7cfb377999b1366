"""The frozen scoring roles of a run: the discriminative reward model and the distillation teacher.

Where they run (:func:`frozen_role_placement`): colocated with the actor in the global pool, or in
a pool of their own (``reward.reward_model.enable_resource_pool``: ``reward_pool`` of
``nnodes x n_gpus_per_node``; ``distillation.nnodes > 0``: ``teacher_pool``; one worker on the
local backend). What the trainer does with them (:class:`FrozenRolesMixin`, a mixin of
:class:`~rlvr.trainer.ppo.ray_trainer.RayPPOTrainer`):

- ``reward_model`` stage: before each batch is scored (training, a greedy baseline, validation),
  ``rm_scores [B, R]`` from the reward-model worker group into the batch; the reward function
  reads them (the reward model alone, or a route ``reward_model`` in ``reward.routes``), and the
  batch carries them on (metrics, the ``trainer.rollout_data_dir`` dumps);
- ``teacher`` stage: after the old log-probs, the teacher's scores of the samples
  (``teacher_log_probs``, or ``teacher_topk_log_probs`` and ``teacher_topk_ids``) into the batch,
  which the actor's update reads.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from rlvr.protocol import DataProto
from rlvr.reward.reward_model import RM_SCORES
from rlvr.single_controller import ClassWithInitArgs
from rlvr.trainer.config.validate_models import uses_reward_model, uses_teacher
from rlvr.trainer.ppo.metric_utils import reduce_metrics
from rlvr.trainer.ppo.utils import Role
from rlvr.utils.errors import ConfigError

__all__ = ["REWARD_POOL", "TEACHER_POOL", "FROZEN_ROLES", "frozen_role_placement", "FrozenRolesMixin"]

REWARD_POOL = "reward_pool"
TEACHER_POOL = "teacher_pool"
FROZEN_ROLES = {"rm": Role.RewardModel, "teacher": Role.TeacherModel}
"""The trainer's name of each frozen role's worker group, and its role."""


def _pool_size(cfg: DictConfig, nnodes: int, n_gpus_per_node: int) -> list[int]:
    return [1] if cfg.trainer.backend == "local" else [n_gpus_per_node] * nnodes


def frozen_role_placement(cfg: DictConfig, global_pool: str) -> tuple[dict[Role, type], dict[Role, str],
                                                                       dict[str, list[int]]]:
    """``(role -> worker class, role -> pool name, pools of their own -> processes per node)`` of the
    frozen roles the config enables."""
    from rlvr.workers.reward_model import RewardModelWorker
    from rlvr.workers.teacher import TeacherWorker

    workers: dict[Role, type] = {}
    pools: dict[Role, str] = {}
    spec: dict[str, list[int]] = {}
    if uses_reward_model(cfg):
        rm = cfg.reward.reward_model
        workers[Role.RewardModel] = RewardModelWorker
        pools[Role.RewardModel] = REWARD_POOL if rm.enable_resource_pool else global_pool
        if rm.enable_resource_pool:
            spec[REWARD_POOL] = _pool_size(cfg, rm.nnodes, rm.n_gpus_per_node)
    if uses_teacher(cfg):
        dist = cfg.distillation
        workers[Role.TeacherModel] = TeacherWorker
        pools[Role.TeacherModel] = TEACHER_POOL if dist.nnodes > 0 else global_pool
        if dist.nnodes > 0:
            spec[TEACHER_POOL] = _pool_size(cfg, dist.nnodes, dist.n_gpus_per_node)
    return workers, pools, spec


class FrozenRolesMixin:
    """The reward-model and teacher stages of the trainer (see the module docstring); uses the
    trainer's ``config``, ``role_worker_mapping`` and the groups ``rm_wg`` / ``teacher_wg``."""

    rm_wg: Any = None
    teacher_wg: Any = None

    def _check_frozen_roles(self) -> None:
        for name, role in FROZEN_ROLES.items():
            enabled = uses_reward_model(self.config) if name == "rm" else uses_teacher(self.config)
            if enabled and role not in self.role_worker_mapping:
                key = "reward.reward_model.enable" if name == "rm" else "distillation.enabled"
                raise ConfigError(key, f"{key} is set but role_worker_mapping has no Role.{role.name}; add its worker "
                                  "(rlvr.trainer.main_ppo.build_role_worker_mapping gives the default mapping)")

    def _frozen_roles(self) -> dict[str, tuple[Role, ClassWithInitArgs]]:
        """The frozen roles to start, by group name (each takes the whole config)."""
        return {name: (role, ClassWithInitArgs(self.role_worker_mapping[role], config=self.config))
                for name, role in FROZEN_ROLES.items() if role in self.role_worker_mapping}

    def _keep_frozen_groups(self, groups: dict[str, Any]) -> None:
        self.rm_wg, self.teacher_wg = groups.get("rm"), groups.get("teacher")

    def _add_rm_scores(self, batch: DataProto) -> dict[str, float]:
        """``rm_scores`` into ``batch`` (once; a batch that has them keeps them); returns the metrics."""
        if self.rm_wg is None or RM_SCORES in batch.batch.keys():
            return {}
        output = self.rm_wg.compute_rm_score(batch)
        batch.batch[RM_SCORES] = output.batch[RM_SCORES]
        return reduce_metrics(output.meta_info["metrics"])

    def _add_teacher_scores(self, batch: DataProto) -> dict[str, float]:
        """The teacher's scores of the samples into ``batch``; returns the metrics."""
        output = self.teacher_wg.compute_teacher_log_prob(batch)
        for key in output.batch.keys():
            batch.batch[key] = output.batch[key]
        return reduce_metrics(output.meta_info["metrics"])
