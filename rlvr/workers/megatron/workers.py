"""The Megatron workers: the FSDP2 workers' classes with megatron-core models behind the same methods.

:class:`MegatronActorRolloutRefWorker` and :class:`MegatronCriticWorker` subclass
:class:`~rlvr.workers.engine_workers.ActorRolloutRefWorker` and
:class:`~rlvr.workers.engine_workers.CriticWorker`: the trainer calls the same methods with the same
batches and gets the same outputs; ``main_ppo`` picks the classes from ``strategy``. What differs:

- Layout: ``tp x cp x pp`` ranks hold one copy of the model and share its rows (tensor, context
  and pipeline parallel, :mod:`~rlvr.workers.megatron.parallel`), the rest of the worker group is
  data parallel. The batch methods dispatch with ``DP_MP_COMPUTE`` (each data-parallel group gets
  one part of the batch; its first rank returns it). On the local backend the driver's worker
  starts the other ``tp x cp x pp - 1`` ranks itself (:mod:`~rlvr.workers.megatron.local_ranks`).
- Models: an HF Llama/Qwen2 checkpoint is loaded, cut into this rank's shard
  (:mod:`~rlvr.workers.megatron.weights`) and trained with rlvr's update loop
  (:mod:`~rlvr.workers.megatron.actor`).
- Rollout: generation stays data parallel over every rank (``DP_COMPUTE_PROTO``), on an HF replica
  of the policy (the model the weights were loaded from) that each weight sync refreshes from the
  gathered shards; on the local backend only rank 0 holds it. The engine's sampling log-probs are
  never reused as ``old_log_probs``: the HF replica and the Megatron model agree to about 1e-5,
  not exactly.
- Checkpoints: one shard per model-parallel rank (:mod:`~rlvr.workers.megatron.checkpoint`).
- LoRA (``actor_rollout_ref.model.lora.rank > 0``): the actor's weights are frozen and adapters
  train (:mod:`~rlvr.workers.megatron.lora`); the weight sync and the export take the merged
  weights; the reference is the actor's stage with the adapters disabled.
"""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from transformers import PreTrainedModel

from rlvr.protocol import DataProto
from rlvr.single_controller.base.decorator import Dispatch, register
from rlvr.single_controller.base.worker import RankInfo
from rlvr.utils.seed import set_seed
from rlvr.workers.checkpoint import save_model_files
from rlvr.workers.engine_workers import ActorRolloutRefWorker, CriticWorker
from rlvr.workers.frozen import FrozenModel
from rlvr.workers.megatron.actor import MegatronPPOActor, MegatronPPOCritic
from rlvr.workers.megatron.checkpoint import export_megatron_hf, load_megatron_state, save_megatron_state
from rlvr.workers.fsdp import compute_dtype
from rlvr.workers.megatron.dist_checkpoint import load_dist_checkpoint
from rlvr.workers.megatron.layout import (context_parallel_size, data_parallel_size, expert_sizes, megatron_lora,
                                          megatron_section, megatron_sizes)
from rlvr.workers.megatron.local_ranks import attach_local_ranks, helper_rank, on_every_rank
from rlvr.workers.megatron.lora import apply_lora
from rlvr.workers.megatron.lora_spec import LoraSpec
from rlvr.workers.megatron.model import transformer_overrides
from rlvr.workers.megatron.parallel import MegatronParallel, init_megatron_parallel
from rlvr.workers.megatron.weights import gather_hf_weights, policy_from_hf, value_model_from_hf
from rlvr.workers.models import build_causal_lm, build_critic, critic_tokenizer
from rlvr.workers.moe import router_replay_mode
from rlvr.workers.optimizer import build_lr_scheduler, build_optimizer
from rlvr.workers.worker_utils import Placement, per_rank_batch_size, set_cpu_threads

if TYPE_CHECKING:
    from rlvr.trainer.config.schema import RefMegatronConfig

__all__ = ["MegatronActorRolloutRefWorker", "MegatronCriticWorker"]


def _prepare(worker, role: str, init_args: tuple) -> None:
    """In ``__init__``: the layout of ``role``, the rank info of ``DP_MP_COMPUTE``, CPU threads and,
    on the local backend, the started ranks (model-parallel, and expert-parallel ranks that each run
    the whole batch)."""
    (tp, pp), cp = megatron_sizes(worker.config, role), context_parallel_size(worker.config, role)
    # the local backend's worker starts every rank of its layout, and each runs the whole batch (its
    # expert-parallel ranks too; on Ray they are data-parallel ranks with batches of their own)
    ep, etp = expert_sizes(worker.config, role)
    ranks = pp * math.lcm(tp * cp, ep * etp)
    worker.megatron_role, worker.parallel = role, None
    if worker.world_size > 1:  # the ranks that share a batch: model-parallel rank 0 of the first context rank collects
        tp_rank, cp_rank, dp_rank, pp_rank = MegatronParallel.coordinates(worker.rank, tp, pp, worker.world_size, cp)
        worker.rank_info = RankInfo(rank=worker.rank, world_size=worker.world_size, dp_rank=dp_rank,
                                    dp_size=worker.world_size // (tp * cp * pp),
                                    tp_rank=tp_rank + tp * (cp_rank + cp * pp_rank), tp_size=tp * cp * pp)
    elif worker.device == "cpu":  # the local backend: this process and the ranks it starts share the cores
        set_cpu_threads(worker.config.trainer.num_threads, ranks)
    timeout_s = float(worker.config.trainer.call_timeout_s)
    worker._local_ranks, worker._local_key = attach_local_ranks(worker, ranks, init_args, timeout_s)


def _join(worker) -> MegatronParallel:
    """``_setup``: the process group (Ray) and megatron-core's groups, then the seed."""
    if worker.world_size > 1:
        worker.init_process_group(timeout_s=float(worker.config.trainer.call_timeout_s))
    tp, pp = megatron_sizes(worker.config, worker.megatron_role)
    megatron: RefMegatronConfig = megatron_section(worker.config, worker.megatron_role)
    seed = int(worker.config.trainer.seed if megatron.seed is None else megatron.seed)  # verl's megatron.seed
    ep, etp = expert_sizes(worker.config, worker.megatron_role)
    parallel = init_megatron_parallel(tp, pp, worker.device, seed, float(worker.config.trainer.call_timeout_s),
                                      context_parallel_size(worker.config, worker.megatron_role), ep, etp)
    set_seed(seed)
    worker.megatron_seed = seed  # also the seed of LoRA adapters' initial values
    return parallel


def _load_dist_checkpoint(module, megatron: RefMegatronConfig, prefix: str = "model.", lm_head: bool = True) -> None:
    """verl's ``megatron.use_dist_checkpointing``: the role's weights from ``dist_checkpointing_path``
    (a Megatron distributed checkpoint) replace the HF ones in ``module``, before it is sharded."""
    config = module.backbone.config if prefix == "backbone." else module.config
    load_dist_checkpoint(module, megatron.dist_checkpointing_path, config, megatron.dist_checkpointing_prefix,
                         prefix, lm_head)


def _load_merged(hf: PreTrainedModel, module) -> None:
    """Copy the stage's gathered weights (adapters merged) into the HF model (collective)."""
    state = hf.state_dict()
    with torch.no_grad():
        for name, tensor in gather_hf_weights(module):
            state[name].copy_(tensor)


class MegatronActorRolloutRefWorker(ActorRolloutRefWorker):
    """Actor, rollout and/or reference on megatron-core (``actor_rollout_ref.actor.strategy=megatron``).

    Args:
        config: the whole run config.
        role: as for :class:`~rlvr.workers.engine_workers.ActorRolloutRefWorker`.
    """

    def __init__(self, config, role: str) -> None:
        super().__init__(config, role)
        self._hf_source: PreTrainedModel | None = None
        _prepare(self, "ref" if role == "ref" else "actor", (config, role))

    def _setup(self) -> None:
        self.parallel = _join(self)

    def _hf_model(self, cfg) -> PreTrainedModel:
        """The HF policy the shards are cut from (loaded once per ``init_model``; frozen, CPU)."""
        if self._hf_source is None:
            self._hf_source = build_causal_lm(cfg.model, trainable=False)
        return self._hf_source

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    @on_every_rank
    def init_model(self) -> None:
        """Load the HF checkpoint into this rank's shards (and the rollout's replica); build the
        optimizer, the schedule and the engine."""
        super().init_model()
        self._hf_source = None

    def _init_actor(self, cfg) -> None:
        hf = self._hf_model(cfg)
        megatron = cfg.actor.megatron
        if megatron.use_dist_checkpointing:  # the policy and the rollout's replica start from it; the
            self._hf_source = None  # reference reloads the HF weights unless its own section says so too
            _load_dist_checkpoint(hf, megatron)
        module = policy_from_hf(hf, self.parallel, transformer_overrides(megatron, cfg.model))
        if megatron_lora(self.config):  # the weights freeze; the adapters train
            spec = LoraSpec.from_config(cfg.model.lora, self.megatron_seed)
            apply_lora(module, spec)
            if spec.b_init != "zero":  # the adapters change the model from the start: the rollout's replica too
                _load_merged(hf, module)
        module = module.to(self.device)
        if self._is_rollout and helper_rank() is None:
            self._rollout_replica = hf.to(self.device)
        optimizer = build_optimizer(module, cfg.actor.optim)
        self.lr_scheduler = build_lr_scheduler(optimizer, cfg.actor.optim)
        mini = per_rank_batch_size(cfg.actor.ppo_mini_batch_size, cfg.rollout.n,
                                   data_parallel_size(self.config, "actor"), "actor_rollout_ref.actor.ppo_mini_batch_size")
        self.actor_module = module
        self.actor = MegatronPPOActor(cfg.actor, module, optimizer, mini_batch_size=mini,
                                      log_prob_micro_batch_size=cfg.rollout.log_prob_micro_batch_size_per_gpu,
                                      compute_dtype=compute_dtype(megatron, module),
                                      router_replay=router_replay_mode(cfg.actor))
        self.actor_placement = Placement(module, optimizer, self.device)
        self._rest_actor()

    def _init_rollout(self, cfg) -> None:
        if helper_rank() is None:  # a started rank of the local backend holds no engine
            super()._init_rollout(cfg)

    def _init_ref(self, cfg) -> None:
        """The reference: a frozen policy of its own or, when this worker's actor trains LoRA adapters,
        the actor's stage with its adapters disabled (the base weights, shared)."""
        self._ref_shares_actor = self._is_actor and megatron_lora(self.config)
        if self._ref_shares_actor:
            self.ref = MegatronPPOActor(cfg.actor, self.actor_module, None, mini_batch_size=1,
                                        log_prob_micro_batch_size=cfg.ref.log_prob_micro_batch_size_per_gpu,
                                        compute_dtype=compute_dtype(cfg.actor.megatron, self.actor_module))
            return
        overrides = transformer_overrides(cfg.ref.megatron, cfg.model)
        hf = self._hf_model(cfg)
        if cfg.ref.megatron.use_dist_checkpointing:
            self._hf_source = None
            _load_dist_checkpoint(hf, cfg.ref.megatron)
        module = policy_from_hf(hf, self.parallel, overrides).to(self.device).requires_grad_(False)
        self.ref = MegatronPPOActor(cfg.actor, module, None, mini_batch_size=1,
                                    log_prob_micro_batch_size=cfg.ref.log_prob_micro_batch_size_per_gpu,
                                    compute_dtype=compute_dtype(cfg.ref.megatron, module))
        self.ref_model = FrozenModel(module, world_size=self.world_size, device=self.device,
                                     param_offload=cfg.ref.megatron.param_offload, shard=False)

    def _rest_actor(self) -> None:
        megatron = self.config.actor_rollout_ref.actor.megatron
        self.actor_placement.place(params=not megatron.param_offload, optimizer=not megatron.optimizer_offload)

    # ------------------------------------------------------------------ rollout weights
    def _sync_rollout_weights(self, force: bool = False) -> dict[str, float]:
        """Bring the rollout engine up to the actor's weights; returns the engine's seconds per sync
        stage (empty for in-process engines, or when the engine already has them)."""
        if force or self.rollout.weights_version != self._weights_version:
            return self._load_rollout_weights(self._weights_version)
        return {}

    @on_every_rank
    def _load_rollout_weights(self, version: int) -> dict[str, float]:
        """Gather the actor's shards into HF tensors (every rank takes part) and load them into the
        rollout engine as weights ``version``; returns the engine's seconds per sync stage."""
        self.actor_placement.place(params=True, optimizer=self.actor_placement.optimizer_on_device)
        weights = gather_hf_weights(self.actor_module)
        if self.rollout is None:
            deque(weights, maxlen=0)
            return {}
        self.rollout.wake_up()
        return self.rollout.update_weights(weights, version) or {}

    def _reuse_rollout_log_probs(self, data: DataProto, temperature: float, calculate_entropy: bool) -> bool:
        return False

    # ------------------------------------------------------------------ batch methods on every model rank
    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE)
    @on_every_rank
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """``old_log_probs [B, R]`` (and ``entropys``), from the Megatron actor."""
        return super().compute_log_prob(data)

    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE)
    @on_every_rank
    def update_actor(self, data: DataProto) -> DataProto:
        """PPO update on the batch; one LR-schedule step."""
        return super().update_actor(data)

    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE)
    @on_every_rank
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """``ref_log_prob [B, R]`` under the reference policy."""
        return super().compute_ref_log_prob(data)

    # ------------------------------------------------------------------ checkpoints and export
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    @on_every_rank
    def save_checkpoint(self, path: str) -> None:
        """Write every model-parallel rank's shard of the actor, its optimizer and LR schedule, and
        (global rank 0) the model's config and tokenizer (what ``rlvr.model_merger`` reads)."""
        self._require(self._is_actor, "save_checkpoint", "actor")
        self.actor_placement.place(params=True, optimizer=True)
        if dist.get_rank() == 0:
            save_model_files(path, self.actor_module.hf_config, self.actor_module.hf_generation_config, self.tokenizer)
        save_megatron_state(path, self.actor_module, self.actor.optimizer, self.lr_scheduler, self.parallel)
        self._rest_actor()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    @on_every_rank
    def load_checkpoint(self, path: str) -> None:
        """Restore what :meth:`save_checkpoint` wrote (same tensor x pipeline sizes)."""
        self._require(self._is_actor, "load_checkpoint", "actor")
        self.actor_placement.place(params=True, optimizer=True)
        load_megatron_state(path, self.actor_module, self.actor.optimizer, self.lr_scheduler, self.parallel)
        self._weights_version += 1
        self._rest_actor()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    @on_every_rank
    def export_hf(self, path: str) -> None:
        """Write the actor's gathered weights and the tokenizer as a Hugging Face folder at ``path``."""
        self._require(self._is_actor, "export_hf", "actor")
        self.actor_placement.place(params=True, optimizer=self.actor_placement.optimizer_on_device)
        export_megatron_hf(path, self.actor_module, self.tokenizer, dist.get_rank())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    @on_every_rank
    def get_actor_weights(self, on_device: bool = False) -> dict[str, torch.Tensor]:
        """The actor's full weights (HF names, a tied head under both names) on rank 0, ``{}`` elsewhere;
        always gathered to the CPU (``on_device`` is accepted for the trainer's call and not honoured:
        a Megatron actor's push goes through host memory)."""
        self._require(self._is_actor, "get_actor_weights", "actor")
        self.actor_placement.place(params=True, optimizer=self.actor_placement.optimizer_on_device)
        state = {name: tensor.detach().to("cpu", copy=True) for name, tensor in gather_hf_weights(self.actor_module)}
        if self.actor_module.shape.tied:
            state["lm_head.weight"] = state["model.embed_tokens.weight"]
        return state if dist.get_rank() == 0 else {}


class MegatronCriticWorker(CriticWorker):
    """The value model on megatron-core (``critic.strategy=megatron``).

    Args:
        config: the whole run config.
    """

    def __init__(self, config) -> None:
        super().__init__(config)
        _prepare(self, "critic", (config,))

    def _setup(self) -> None:
        self.parallel = _join(self)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    @on_every_rank
    def init_model(self) -> None:
        """Load the HF critic (backbone and value head) into this rank's shards; build the optimizer
        and the schedule."""
        self._setup()
        cfg = self.config.critic
        self.tokenizer = critic_tokenizer(self.config)
        path = cfg.model.path or self.config.actor_rollout_ref.model.path  # schema: None = the actor's model
        critic = build_critic(cfg.model, path)
        if cfg.megatron.use_dist_checkpointing:  # the backbone; the value head keeps its init (as in verl)
            _load_dist_checkpoint(critic, cfg.megatron, prefix="backbone.", lm_head=False)
        module = value_model_from_hf(critic, self.parallel, transformer_overrides(cfg.megatron, cfg.model)
                                     ).to(self.device)
        optimizer = build_optimizer(module, cfg.optim)
        self.lr_scheduler = build_lr_scheduler(optimizer, cfg.optim)
        mini = per_rank_batch_size(cfg.ppo_mini_batch_size, self.config.actor_rollout_ref.rollout.n,
                                   data_parallel_size(self.config, "critic"), "critic.ppo_mini_batch_size")
        self.critic_module = module
        self.critic = MegatronPPOCritic(cfg, module, optimizer, mini_batch_size=mini,
                                        compute_dtype=compute_dtype(cfg.megatron, module))
        self.placement = Placement(module, optimizer, self.device)
        self._rest()

    def _rest(self) -> None:
        megatron = self.config.critic.megatron
        self.placement.place(params=not megatron.param_offload, optimizer=not megatron.optimizer_offload)

    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE)
    @on_every_rank
    def compute_values(self, data: DataProto) -> DataProto:
        """``values [B, R]`` of the response positions."""
        return super().compute_values(data)

    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE)
    @on_every_rank
    def update_critic(self, data: DataProto) -> DataProto:
        """Clipped value-loss update on the batch; one LR-schedule step."""
        return super().update_critic(data)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    @on_every_rank
    def save_checkpoint(self, path: str) -> None:
        """Write every model-parallel rank's shard of the critic, its optimizer and LR schedule."""
        self.placement.place(params=True, optimizer=True)
        save_megatron_state(path, self.critic_module, self.critic.optimizer, self.lr_scheduler, self.parallel)
        self._rest()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    @on_every_rank
    def load_checkpoint(self, path: str) -> None:
        """Restore what :meth:`save_checkpoint` wrote (same tensor x pipeline sizes)."""
        self.placement.place(params=True, optimizer=True)
        load_megatron_state(path, self.critic_module, self.critic.optimizer, self.lr_scheduler, self.parallel)
        self._rest()
