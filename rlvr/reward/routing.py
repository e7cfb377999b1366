"""The run's reward routing: which reward source scores which domain (``reward.routes``).

``reward.routes`` maps a domain, the value of the non-tensor field ``reward.route_key``
(``data_source`` or ``tag``) of a sample, to a reward worker (a name of the reward-worker registry:
``math_rule``, ``ifeval``, ``code_sandbox``, ...), to a reward manager (``naive``, ``dapo``,
``batch``, ``parallel``), to ``reward_model`` (the discriminative reward model's scores), or to a
weighted sum of them (``reward_model+0*math_rule``: :mod:`rlvr.reward.route_spec`). With routes set,
the trainer

1. checks them with the config (:func:`check_reward_routes`: every name is known, the process
   count fits the backend, every domain in the training and validation data files has a route;
   :func:`check_data_routes` does the same for dataset objects given to the trainer), before any
   model or worker starts;
2. starts the reward worker groups (:class:`RewardWorkerGroups`): the routed reward workers share
   one resource pool of ``reward.num_workers`` CPU processes (the driver itself on the local
   backend), each reward worker its own worker group whose ``compute_rewards`` is
   ``DP_MP_COMPUTE`` (every process scores its share of a domain's samples). They hold no training
   state, so they can be torn down and started again at any step;
3. scores every batch through a :class:`~rlvr.reward.router.RewardRouter` over those groups and
   the routed managers (the managers run on the driver), which reports ``reward/<domain>/...``.

Without routes, the reward model (``reward.reward_model.enable``) or else
``reward_model.reward_manager`` scores every sample (verl's path).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlvr.reward.config import RewardWorkerConfig
from rlvr.reward.managers import REWARD_MANAGER_REGISTRY
from rlvr.reward.reward_fn import build_reward_manager
from rlvr.reward.reward_model import RewardModelScores
from rlvr.reward.route_spec import RM_ROUTE, RouteTerm, parse_route
from rlvr.reward.router import RewardRouter, WeightedRoute
from rlvr.reward.workers import REWARD_WORKER_REGISTRY, get_reward_worker
from rlvr.single_controller import ClassWithInitArgs, create_colocated_worker_cls
from rlvr.single_controller.backend import get_resource_pool_cls, get_worker_group_cls
from rlvr.utils.errors import ConfigError
from rlvr.utils.user_code import is_object_path

__all__ = [
    "RewardWorkerGroups",
    "build_reward_router",
    "check_data_routes",
    "check_reward_functions",
    "check_reward_routes",
    "check_routed_domains",
    "dataset_domains",
    "file_domains",
    "reward_worker_config",
    "RoutedRewardWorker",
    "reward_routers",
    "route_terms",
    "routed_worker_names",
    "RM_ROUTE",
]


def route_terms(cfg: DictConfig, domain: str) -> list[RouteTerm]:
    """The terms of ``reward.routes.<domain>`` (one reward source, or a weighted sum: see
    :mod:`rlvr.reward.route_spec`); a malformed value is a :class:`ConfigError`."""
    key = f"reward.routes.{domain}"
    try:
        return parse_route(cfg.reward.routes[domain], key)
    except ValueError as err:
        raise ConfigError(key, str(err)) from None


def routed_worker_names(cfg: DictConfig) -> list[str]:
    """The reward workers that ``reward.routes`` sends at least one domain to (sorted)."""
    return sorted({term.name for domain in cfg.reward.routes for term in route_terms(cfg, str(domain))
                   if REWARD_WORKER_REGISTRY.has(term.name)})


def _check_target(key: str, target: str) -> None:
    """``target`` is exactly one of a reward worker and a reward manager."""
    is_worker, is_manager = REWARD_WORKER_REGISTRY.has(target), REWARD_MANAGER_REGISTRY.has(target)
    if is_object_path(target) and not (is_worker or is_manager):
        raise ConfigError(key, _unloadable(target))
    if is_worker and is_manager:
        raise ConfigError(key, f"{target!r} is registered both as a reward worker and as a reward manager; "
                          "register one of them under another name")
    if not (is_worker or is_manager):
        raise ConfigError(key, f"{target!r} is neither a reward worker ({', '.join(REWARD_WORKER_REGISTRY.names())}), "
                          f"a reward manager ({', '.join(REWARD_MANAGER_REGISTRY.names())}) nor {RM_ROUTE!r} "
                          "(the discriminative reward model)")


def check_reward_routes(cfg: DictConfig) -> None:
    """Raise :class:`ConfigError` for a route to an unknown or ambiguous name, a malformed weighted
    sum, or a process count the backend cannot run (the reward model's own checks are
    :func:`~rlvr.trainer.config.validate_models.check_reward_model`)."""
    reward = cfg.reward
    for domain in reward.routes:
        for term in route_terms(cfg, str(domain)):
            if term.name != RM_ROUTE:
                _check_target(f"reward.routes.{domain}", term.name)
    if reward.num_workers < 1:
        raise ConfigError("reward.num_workers", f"must be >= 1 process per reward worker group, got {reward.num_workers}")
    if cfg.trainer.backend == "local" and reward.num_workers != 1:
        raise ConfigError("reward.num_workers", "the local backend runs the reward workers in the driver (one "
                          f"process), got reward.num_workers={reward.num_workers}; set it to 1 or use trainer.backend=ray")
    if reward.routes:
        for what, files in (("training data", cfg.data.train_files), ("validation data", cfg.data.val_files)):
            check_routed_domains(file_domains(files, reward.route_key, what), cfg, what)


def _unloadable(target: str) -> str:
    """Why the object path ``target`` is neither a reward worker nor a reward manager."""
    reasons = []
    for registry in (REWARD_WORKER_REGISTRY, REWARD_MANAGER_REGISTRY):
        try:
            registry[target]
        except KeyError as err:
            reasons.append(str(err))
    return "; ".join(reasons)


def _role(name: str) -> str:
    """The role (method prefix) of the routed reward worker ``name`` in the colocated class: the
    name itself, or an object path with its dots and colon made underscores."""
    return re.sub(r"\W", "_", name)


def file_domains(files: Any, key: str, what: str) -> set[str]:
    """The distinct domains (``key``: ``data_source`` or ``tag``) of the rows of the data ``files``
    (a path, a list of paths, or None)."""
    from rlvr.trainer.data.rl_dataset import read_rows, row_tag

    paths = [] if files is None else [files] if isinstance(files, str) else list(files)
    domains: set[str] = set()
    for path in paths:
        for row in read_rows(path):
            if key != "tag" and key not in row:
                raise ConfigError("reward.route_key", f"a row of the {what} ({path}) has no column {key!r} (it has "
                                  f"{sorted(row)}); route on a column the data has, e.g. reward.route_key=data_source")
            domains.add(str(row_tag(row) if key == "tag" else row[key]))
    return domains


def check_reward_functions(cfg: DictConfig, reward_fn: Any, val_reward_fn: Any) -> bool:
    """Whether the trainer routes rewards itself: with ``reward.routes`` the caller passes no reward
    functions, without it a training one. Raises :class:`ConfigError` otherwise."""
    if cfg.reward.routes:
        if reward_fn is not None or val_reward_fn is not None:
            raise ConfigError("reward.routes", "reward.routes builds the reward function from reward worker groups "
                              "and managers; pass reward_fn=None and val_reward_fn=None, or clear reward.routes")
        return True
    if reward_fn is None:
        raise ConfigError("reward_model.reward_manager", "the trainer needs a reward_fn: build one with "
                          "rlvr.trainer.ppo.reward.load_reward_manager(config, tokenizer, num_examine), "
                          "or route domains to reward workers with reward.routes")
    return False


def dataset_domains(dataset: Any, key: str, what: str) -> set[str]:
    """The distinct values of the non-tensor field ``key`` over the items of ``dataset``."""
    domains: set[str] = set()
    for index in range(len(dataset)):
        item = dataset[index]
        if key not in item:
            raise ConfigError("reward.route_key", f"the {what} items have no field {key!r} (they have {sorted(item)}); "
                              "route on a field the data has, e.g. reward.route_key=data_source")
        domains.add(str(item[key]))
    return domains


def check_routed_domains(domains: Iterable[str], cfg: DictConfig, what: str) -> None:
    """Raise :class:`ConfigError` naming every domain of ``domains`` that has no route."""
    routes = cfg.reward.routes
    missing = sorted(set(domains) - {str(domain) for domain in routes})
    if missing:
        raise ConfigError(
            "reward.routes",
            f"the {what} has {cfg.reward.route_key} value(s) {', '.join(map(repr, missing))} with no reward route "
            f"(routes exist for: {', '.join(sorted(map(str, routes)))}); add reward.routes.<domain>=<reward worker "
            "or manager> for each, or leave them out of the data",
        )


def check_data_routes(cfg: DictConfig, train_dataset: Any, val_dataset: Any) -> None:
    """Every domain of the given training and validation datasets (None: not given) has a route."""
    for what, dataset in (("training data", train_dataset), ("validation data", val_dataset)):
        if dataset is not None:
            check_routed_domains(dataset_domains(dataset, cfg.reward.route_key, what), cfg, what)


def reward_worker_config(cfg: DictConfig, name: str) -> RewardWorkerConfig:
    """The config a routed reward worker is built with: its ``reward.workers.<name>`` section (the
    config class's defaults for a worker without one), decoding with the policy's tokenizer unless
    the section names another."""
    workers = cfg.reward.workers
    config = OmegaConf.to_object(workers[name]) if name in workers else get_reward_worker(name).config_cls()
    if config.tokenizer_path is None:
        model = cfg.actor_rollout_ref.model
        config.tokenizer_path = model.tokenizer_path or model.path
    return config


class RewardWorkerGroups:
    """The routed reward workers: one CPU resource pool, one worker group per reward worker.

    Args:
        cfg: the run config (``reward`` section, ``trainer.call_timeout_s``).
        backend: ``"ray"`` or ``"local"``.

    Attributes:
        groups: reward worker name -> its worker group (``initialize`` already called).
    """

    def __init__(self, cfg: DictConfig, backend: str) -> None:
        names = routed_worker_names(cfg)
        classes = {_role(name): ClassWithInitArgs(get_reward_worker(name).worker_cls, reward_worker_config(cfg, name))
                   for name in names}
        processes = int(cfg.reward.num_workers) if backend == "ray" else 1
        self.pool = get_resource_pool_cls(backend)(process_on_nodes=[processes], use_gpu=False, name_prefix="reward")
        try:
            self._group = get_worker_group_cls(backend)(
                self.pool, create_colocated_worker_cls(classes), name_prefix="reward_workers",
                call_timeout_s=float(cfg.trainer.call_timeout_s),
            )
        except BaseException:
            self.pool.remove()
            raise
        self._stopped = False
        roles = self._group.spawn([_role(name) for name in names])
        self.groups: dict[str, Any] = {name: roles[_role(name)] for name in names}
        try:
            for group in self.groups.values():
                group.initialize(cfg)
        except BaseException:
            self.shutdown()  # a worker that cannot start leaves no processes or reserved resources behind
            raise

    def shutdown(self) -> None:
        """Stop the worker processes and give the pool back (once; later calls do nothing)."""
        if self._stopped:
            return
        self._stopped = True
        self._group.shutdown()
        self.pool.remove()


class RoutedRewardWorker:
    """One routed reward worker, reached through a restartable handle on the run's
    :class:`RewardWorkerGroups` (the trainer's :class:`~rlvr.trainer.recovery.RestartableGroup`):
    when one of its processes dies or hangs, the reward groups are started again and the call is
    sent again, without rolling training back (the workers hold no training state).

    Args:
        workers: anything with ``run(call)`` that calls ``call(reward_worker_groups)``.
        name: the reward worker's route name (``math_rule``, ``code_sandbox``, ...).
    """

    def __init__(self, workers: Any, name: str) -> None:
        self.workers = workers
        self.name = name

    def compute_rewards(self, data: Any) -> Any:
        return self.workers.run(lambda groups: groups.groups[self.name].compute_rewards(data))


def build_reward_router(cfg: DictConfig, tokenizer: Any, groups: dict[str, Any], num_examine: int) -> RewardRouter:
    """The reward function of a routed run: each domain scored by its reward worker group (from
    ``groups``), its reward manager (built here, one per manager name, from ``reward_model``), the
    reward model's scores (``reward_model``, read from the batch), or a :class:`WeightedRoute` of
    several of them."""
    managers: dict[str, Any] = {RM_ROUTE: RewardModelScores()}
    routes: dict[str, Any] = {}
    for domain in cfg.reward.routes:
        terms = []
        for term in route_terms(cfg, str(domain)):
            if term.name in groups:
                source = groups[term.name]
            else:
                if term.name not in managers:
                    managers[term.name] = build_reward_manager(cfg, term.name, tokenizer, num_examine,
                                                               key=f"reward.routes.{domain}")
                source = managers[term.name]
            terms.append((term.weight, term.name, source))
        single = len(terms) == 1 and terms[0][0] == 1.0
        routes[str(domain)] = terms[0][2] if single else WeightedRoute(str(domain), terms, accuracy_exempt=(RM_ROUTE,))
    return RewardRouter(routes, key=cfg.reward.route_key, tokenizer=tokenizer, num_examine=num_examine,
                        on_error=cfg.reward_model.on_error, fallback_score=cfg.reward_model.fallback_score)


def reward_routers(cfg: DictConfig, tokenizer: Any, workers: Any, with_validation: bool
                   ) -> tuple[RewardRouter, RewardRouter | None]:
    """The training reward function of a routed run (printing ``reward_model.num_examine`` samples per
    source) and, ``with_validation``, the validation one; ``workers`` is the restartable handle on the
    run's :class:`RewardWorkerGroups` (see :class:`RoutedRewardWorker`)."""
    handles = {name: RoutedRewardWorker(workers, name) for name in routed_worker_names(cfg)}
    reward_fn = build_reward_router(cfg, tokenizer, handles, cfg.reward_model.num_examine)
    val_reward_fn = build_reward_router(cfg, tokenizer, handles, 0) if with_validation else None
    return reward_fn, val_reward_fn
