"""The model workers: ``TrainingWorker`` (what they share), ``ActorRolloutRefWorker`` and ``CriticWorker``.

Every worker receives the whole run config (``RlvrConfig`` as an OmegaConf DictConfig) and runs
as a Ray actor or inside the driver (local backend); methods are called through a worker group.

``ActorRolloutRefWorker`` plays the actor, the rollout and/or the reference, by ``role``; a
standalone reference policy is ``ActorRolloutRefWorker(config, role="ref")``. ``CriticWorker``
holds the value model.

Hybrid worker (``role="actor_rollout_ref"``): one process holds the actor, the rollout and the
reference.

- Weights actor -> rollout, in-process, versioned. With one rank the HF engine *shares* the actor's
  module: nothing is copied. With several ranks the actor is FSDP2-sharded and the HF engine keeps
  an unsharded replica; an engine with weights of its own (vLLM) holds its own copy. Either is
  refreshed in place (all-gather, one parameter at a time) by :meth:`update_weights` after every
  actor update (the trainer's ``update_weights`` stage), at the latest before the next generation.
  The engine reports the version of the weights it generated with (``rollout_weights_version``),
  the worker adds the actor's (``actor_weights_version``), and the trainer refuses a mismatch.
- On GPU the actor's optimizer state (and its parameters, when the rollout has its own replica)
  move to CPU during generation and back for training; the rollout's KV cache is freed after
  generation (``rollout.free_cache_engine``).
- Reference: a separate frozen model, or - when the actor trains LoRA adapters - the actor's
  module with the adapters disabled (peft ``disable_adapter()``), sharing the base weights.
- ``compute_log_prob`` reuses the rollout's sampling log-probs as ``old_log_probs`` (no forward)
  when ``actor.use_rollout_log_probs`` is on and they are exact for the current weights: the
  rollout ran on this worker with the actor's current weights (``meta_info
  ["rollout_weights_version"]``) or, with a rollout worker group of its own, every sampled token's
  version (``response_versions``) is the one the trainer says is current (``meta_info
  ["policy_version"]``), the engine reports them exact (fp32 model,
  ``meta_info["rollout_log_probs_exact"]``), at the same temperature, and no entropy is asked for.
  The asynchronous trainer without decoupled PPO (``async_training.compute_prox_log_prob=false``)
  sets ``meta_info["old_log_probs_from_rollout"]``: the behaviour policy's log-probs are then the
  old ones whatever their version. The trainer keeps the rollout's ``meta_info`` in the batch
  (``DataProto.union`` does).
- A rollout worker group of its own (``role="rollout"``, ``actor_rollout_ref.hybrid_engine=false``)
  takes new weights while it generates: they wait for the end of the generation, or interrupt it
  for a partial rollout (``rlvr.workers.rollout.partial``). Its output leaves the engine's one
  ``rollout_weights_version`` out (its ranks may end a call on different versions): the per-token
  ``response_versions`` say which weights sampled what.

Outputs of the DP_COMPUTE_PROTO methods carry ``meta_info["metrics"]`` (name -> list of floats)
and ``meta_info["timing"]`` (stage -> seconds, the slowest rank).
"""

from __future__ import annotations

import copy

import torch
from peft import PeftModel

from rlvr.agent import AgentLoopManager
from rlvr.protocol import DataProto
from rlvr.single_controller.base.decorator import Dispatch, register
from rlvr.single_controller.base.worker import Worker
from rlvr.utils import core_lending
from rlvr.utils.model import load_tokenizer
from rlvr.utils.profiler.worker import WorkerProfiler
from rlvr.utils.seed import get_rng_state, set_rng_state, set_seed
from rlvr.utils.tokenizer import hf_processor, set_chat_template
from rlvr.workers.actor.dp_actor import DataParallelPPOActor
from rlvr.workers.checkpoint import (export_hf_model, load_training_state, lora_settings, merge_lora, save_model_files,
                                     save_training_state)
from rlvr.workers.critic.dp_critic import DataParallelPPOCritic
from rlvr.workers.frozen import frozen_policy
from rlvr.workers.fsdp import compute_dtype, fsdp_options, full_parameters, full_state_dict, shard_role_module
from rlvr.workers.models import build_causal_lm, build_critic, critic_tokenizer, unwrap_hf_model
from rlvr.workers.moe import router_replay_mode
from rlvr.workers.moe.layout import ROUTED_EXPERTS
from rlvr.workers.optimizer import build_lr_scheduler, build_optimizer
from rlvr.workers.rollout import get_rollout_engine
from rlvr.workers.rollout.base import check_weights_version
from rlvr.workers.rollout.partial import WeightInbox
from rlvr.workers.rollout.placement import RolloutPlacement
from rlvr.workers.worker_utils import (
    Placement,
    rollout_dtype,
    seed_role,
    use_full_determinism,
    StageTimer,
    cpu_workers,
    peak_memory_metrics,
    per_rank_batch_size,
    set_cpu_threads,
)

__all__ = ["ActorRolloutRefWorker", "TrainingWorker", "CriticWorker"]

HYBRID_ROLES = ("actor", "rollout", "ref", "actor_ref", "actor_rollout", "actor_rollout_ref")


class TrainingWorker(Worker):
    """What every model worker shares: config, threads, process group, seeding, replies, RNG states.

    Args:
        config: the whole run config.
    """

    def __init__(self, config, roles: tuple[str, ...] = ()) -> None:
        super().__init__(config)
        self.config = config
        if self.device == "cpu":
            set_cpu_threads(config.trainer.num_threads, cpu_workers(config))
        self.profiler = WorkerProfiler(config, roles, self.rank, self.device)

    def _device_type(self) -> str:
        return "cuda" if self.device.startswith("cuda") else "cpu"

    def _setup(self) -> None:
        """Join the process group (several ranks; collectives time out after the role's
        ``nccl_timeout``), seed identically on every rank so that randomly initialised parts (the
        value head) agree before sharding, and turn on deterministic kernels when a role of this
        worker asks for them (``full_determinism``)."""
        if self.world_size > 1:
            self.init_process_group(timeout_s=float(self._process_group_timeout()))
        set_seed(int(self.config.trainer.seed))
        if self._full_determinism():
            use_full_determinism()

    def _process_group_timeout(self) -> float:
        timeout = self.config.actor_rollout_ref.nccl_timeout
        return float(self.config.trainer.call_timeout_s if timeout is None else timeout)

    def _full_determinism(self) -> bool:
        arr = self.config.actor_rollout_ref
        return bool(arr.actor.fsdp_config.full_determinism or arr.ref.fsdp_config.full_determinism
                    or arr.rollout.full_determinism)

    def _reply(self, tensors: dict[str, torch.Tensor] | None, metrics: dict, timer: StageTimer,
               stage: str) -> DataProto:
        metrics = {**metrics, **peak_memory_metrics(self.device, stage)}
        return DataProto.from_dict(tensors=tensors, meta_info={"metrics": metrics, "timing": timer.result()})

    def _timer(self) -> StageTimer:
        return StageTimer(self.world_size, self.device, self.profiler.stage)

    def _extra_rng_state(self) -> dict:
        return {}

    def _load_extra_rng_state(self, state: dict) -> None:
        return None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def start_profile(self, profile_step: int) -> None:
        """Profile this worker's enabled roles in training step ``profile_step`` (``global_profiler``)."""
        self.profiler.start(profile_step)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def stop_profile(self, flush: bool = True, run_command: bool = False) -> dict:
        """End the profiled step; ``flush`` writes its traces, ``run_command`` runs ``finish_hook_cmd``.
        Returns this rank's report per role (:meth:`rlvr.utils.profiler.worker.WorkerProfiler.stop`)."""
        return self.profiler.stop(flush, run_command)

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def get_rng_state(self) -> dict:
        """This rank's RNG states (global generators and the rollout's sampling generator)."""
        return {"global": get_rng_state(), **self._extra_rng_state()}

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def set_rng_state(self, state: dict) -> None:
        """Restore this rank's RNG states from :meth:`get_rng_state` (one state per rank)."""
        set_rng_state(state["global"])
        self._load_extra_rng_state(state)


class ActorRolloutRefWorker(TrainingWorker):
    """Actor, rollout and/or reference in one worker.

    Args:
        config: the whole run config.
        role: ``"actor"``, ``"rollout"``, ``"ref"``, ``"actor_ref"``, ``"actor_rollout"`` or
            ``"actor_rollout_ref"`` (``"actor"`` / ``"actor_ref"`` train beside a separate rollout
            worker group, ``"rollout"``: ``actor_rollout_ref.hybrid_engine=false``).
    """

    def __init__(self, config, role: str) -> None:
        if role not in HYBRID_ROLES:
            raise ValueError(f"{type(self).__name__} role must be one of {HYBRID_ROLES}, got {role!r}")
        super().__init__(config, tuple(role.split("_")))
        self.role = role
        self._is_actor = role in ("actor", "actor_ref", "actor_rollout", "actor_rollout_ref")
        self._is_rollout = role in ("rollout", "actor_rollout", "actor_rollout_ref")
        self._is_ref = role in ("ref", "actor_ref", "actor_rollout_ref")
        self.actor = self.rollout = self.ref = None
        self._weights_version = 0
        self._rollout_replica = None
        self._rollout_shares_actor = False
        self._ref_shares_actor = False
        if role == "rollout" and self.device == "cpu" and config.async_training.lend_idle_cores:
            core_lending.attach_rollout_from_env(torch.get_num_threads())  # the trainer's idle cores

    def _require(self, present: bool, method: str, part: str) -> None:
        if not present:
            raise RuntimeError(
                f"{type(self).__name__}(role={self.role!r}) has no {part}, so it cannot run {method}(); "
                f"create the worker with a role that includes the {part}"
            )

    # ------------------------------------------------------------------ construction
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Load the models of this worker's roles and build optimizer, schedule and engine."""
        self._setup()
        cfg = self.config.actor_rollout_ref
        self.tokenizer = load_tokenizer(cfg.model.tokenizer_path or cfg.model.path)
        self.processor = hf_processor(cfg.model.path, trust_remote_code=cfg.model.trust_remote_code)  # None: text
        set_chat_template(self.tokenizer, self.processor, cfg.model.custom_chat_template)
        if self._is_actor:
            self._init_actor(cfg)
        if self._is_rollout:
            self._init_rollout(cfg)
        if self._is_ref:
            self._init_ref(cfg)

    def _init_actor(self, cfg) -> None:
        fsdp = cfg.actor.fsdp_config
        seed_role(fsdp)
        module = build_causal_lm(cfg.model, trainable=True, dtype=fsdp.model_dtype,
                                 freeze_vision=cfg.actor.freeze_vision_tower).to(self.device)
        own_dtype = rollout_dtype(cfg.rollout, module)  # the HF engine in another dtype keeps its own copy
        if (self._is_rollout and (self.world_size > 1 or own_dtype is not None)
                and get_rollout_engine(cfg.rollout.name).runs_torch_module):
            self._rollout_replica = copy.deepcopy(module).to(own_dtype or next(module.parameters()).dtype)
            self._rollout_replica.requires_grad_(False)
        precision = compute_dtype(fsdp, module)
        module = shard_role_module(module, self.world_size, self._device_type(), fsdp)
        optimizer = build_optimizer(module, cfg.actor.optim)
        self.lr_scheduler = build_lr_scheduler(optimizer, cfg.actor.optim)
        mini = per_rank_batch_size(cfg.actor.ppo_mini_batch_size, cfg.rollout.n, self.world_size,
                                   "actor_rollout_ref.actor.ppo_mini_batch_size")
        self.actor_module = module
        self.actor = DataParallelPPOActor(
            cfg.actor, module, optimizer, mini_batch_size=mini,
            log_prob_micro_batch_size=cfg.rollout.log_prob_micro_batch_size_per_gpu,
            world_size=self.world_size, device=self.device,
            log_prob_use_dynamic_bsz=cfg.rollout.log_prob_use_dynamic_bsz,
            log_prob_max_token_len=cfg.rollout.log_prob_max_token_len_per_gpu,
            use_remove_padding=cfg.model.use_remove_padding, sp_size=cfg.actor.ulysses_sequence_parallel_size,
            compute_dtype=precision, compile_forward=cfg.actor.use_torch_compile,
            distillation=self.config.distillation, router_replay=router_replay_mode(cfg.actor),
        )
        self.actor_placement = Placement(module, optimizer, self.device)
        self._rest_actor()

    def _init_rollout(self, cfg) -> None:
        factory = get_rollout_engine(cfg.rollout.name)
        if self._is_actor:
            shared = factory.runs_torch_module and self._rollout_replica is None
            module = self.actor_module if shared or self._rollout_replica is None else self._rollout_replica
        else:  # parameters that require grad, as the actor's (the decode runs under no_grad: no cost): for
            # frozen weights PyTorch's CPU linear on the prefill's last hidden state (logits_to_keep=1) takes
            # another path, 1e-7 apart, and a rollout apart would not sample what the one-rank hybrid does
            module = build_causal_lm(cfg.model, trainable=False, dtype=cfg.rollout.dtype)
            shared, module = False, module.requires_grad_(True).to(self.device)
        # in-process engines span tensor_model_parallel_size consecutive workers; server replicas have their own ranks
        ranks = int(cfg.rollout.tensor_model_parallel_size) if cfg.rollout.mode == "sync" else 1
        self.rollout_placement = RolloutPlacement(ranks, self.rank, self.world_size)
        seed = self.rollout_placement.engine_seed(self.config.trainer.seed, cfg.rollout.seed)
        self.rollout = factory(cfg.rollout, module, self.tokenizer, self.device, seed, not shared)
        self._rollout_shares_actor = shared
        # a rollout worker of its own takes weights while it generates (async_training.partial_rollout)
        partial = bool(self.config.async_training.partial_rollout) and not self._is_actor
        self.weight_inbox = WeightInbox(self.rollout, partial)
        if not factory.runs_torch_module:  # the engine starts without the policy's weights
            self.rollout.update_weights(full_parameters(module) if self._is_actor else module.named_parameters(),
                                        self._weights_version)
        self.agent_loops = AgentLoopManager(cfg.rollout, self.tokenizer, self.processor)

    def _init_ref(self, cfg) -> None:
        """The reference: a frozen policy (:func:`~rlvr.workers.frozen.frozen_policy`) of its own, or -
        when the actor trains LoRA adapters - the actor's module with the adapters disabled."""
        self._ref_shares_actor = self._is_actor and cfg.model.lora_rank > 0
        ref = cfg.ref
        module = self.actor_module if self._ref_shares_actor else build_causal_lm(
            cfg.model, trainable=False, dtype=ref.fsdp_config.model_dtype).to(self.device)
        options = fsdp_options(ref.fsdp_config, module)
        options.pop("reshard_after_forward")  # frozen_policy takes it from fsdp_config
        self.ref_model, self.ref = frozen_policy(
            module, cfg.actor, world_size=self.world_size, device=self.device, fsdp_config=ref.fsdp_config,
            micro_batch_size=ref.log_prob_micro_batch_size_per_gpu, use_dynamic_bsz=ref.log_prob_use_dynamic_bsz,
            max_token_len=ref.log_prob_max_token_len_per_gpu, use_remove_padding=cfg.model.use_remove_padding,
            sp_size=ref.ulysses_sequence_parallel_size, shared=self._ref_shares_actor, shard_options=options,
            compute_dtype=options["param_dtype"], compile_forward=ref.use_torch_compile)

    def _rest_actor(self) -> None:
        """Actor placement between phases (CPU when offload is configured; GPU only)."""
        fsdp = self.config.actor_rollout_ref.actor.fsdp_config
        self.actor_placement.place(params=not fsdp.param_offload, optimizer=not fsdp.optimizer_offload)

    def _temperature(self, data: DataProto) -> float:
        data.meta_info.setdefault("temperature", float(self.config.actor_rollout_ref.rollout.temperature))
        return float(data.meta_info["temperature"])

    # ------------------------------------------------------------------ rollout
    def _sync_rollout_weights(self, force: bool = False) -> dict[str, float]:
        """Bring the rollout engine up to the actor's weights (version ``_weights_version``); returns
        the engine's per-stage seconds (empty when it has none). An engine sharing the actor's module
        has nothing to copy, but still learns the version."""
        if not force and self.rollout.weights_version == self._weights_version:
            return {}
        if not self._rollout_shares_actor:
            self.actor_placement.place(params=True, optimizer=self.actor_placement.optimizer_on_device)
            self.rollout.wake_up()
        return self.rollout.update_weights(full_parameters(self.actor_module), self._weights_version) or {}

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Responses for left-padded prompts (one per row; see ``rlvr.workers.rollout.base``), made by
        each row's agent loop over the rollout engine (``rlvr.agent``: single turn, tools, environments)."""
        self._require(self._is_rollout, "generate_sequences", "rollout")
        timer = self._timer()
        with timer.stage("gen"):
            if self._is_actor:
                self._sync_rollout_weights()
                self.actor_placement.place(params=self._rollout_shares_actor, optimizer=False)
            rows, counts = self.rollout_placement.gather(prompts)  # the rows of every rank of this engine
            with self.weight_inbox.generation(bool(prompts.meta_info.get("validate", False)),
                                              self.config.actor_rollout_ref.rollout.free_cache_engine) as engine:
                output = self.rollout_placement.own(self.agent_loops.generate_sequences(engine, rows), counts)
        metrics = {**output.meta_info.get("metrics", {}), **peak_memory_metrics(self.device, "gen"),
                   **core_lending.take_lent_share("rollout"),
                   "rollout/weights_version": float(self.rollout.weights_version)}  # one entry per worker
        if self.weight_inbox.interrupt is not None:
            metrics["async/interrupted_generations"] = float(self.weight_inbox.last_interrupted_rows)
        output.meta_info.update(metrics=metrics, timing=timer.result())
        if not self.config.actor_rollout_ref.rollout.calculate_log_probs:
            output.batch.pop("rollout_log_probs")  # verl's calculate_log_probs=false: no rollout log-probs
        if self._is_actor:
            output.meta_info["actor_weights_version"] = self._weights_version
            if self.rollout_placement.num_engines > 1:  # the trainer sees the engines' outputs merged: each checks itself
                check_weights_version(output.meta_info, f"rollout engine {self.rollout_placement.engine} of "
                                                        f"{self.rollout_placement.num_engines} (worker rank {self.rank})")
        else:  # a rollout group apart: its ranks may end a call on different versions; response_versions say which
            output.meta_info.pop("rollout_weights_version")
        return output

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def update_weights(self, weights=None, version: int | None = None) -> dict[str, float]:
        """Load weights into the rollout engine in place: ``(name, tensor)`` pairs, a state dict (names
        of the policy's parameters) or a handle (the local backend's push through shared memory or
        CUDA IPC: ``rlvr.workers.rollout.shared_weights.WeightsHandle``) as weights ``version`` (None = the engine's version + 1),
        or ``weights=None`` to sync the actor's current weights in-process (the trainer's
        ``update_weights`` stage after every actor update). When the rollout shares the actor's
        module (hybrid, one rank), given weights change the actor too. Weights that arrive while
        the engine generates (a rollout worker of its own) wait for the end of the generation, or
        interrupt it with ``async_training.partial_rollout`` (see ``rlvr.workers.rollout.partial``).
        Returns the engine's seconds per sync stage (a server engine: write, pause, reload, ...; empty
        for in-process engines and for weights that wait for the end of a generation)."""
        self._require(self._is_rollout, "update_weights", "rollout")
        if weights is None:
            self._require(self._is_actor, "update_weights(None)", "actor")
            return self._sync_rollout_weights(force=True)
        return self.weight_inbox.deliver(weights, self.rollout.weights_version + 1 if version is None else version)

    # ------------------------------------------------------------------ actor
    def _reuse_rollout_log_probs(self, data: DataProto, temperature: float, calculate_entropy: bool) -> bool:
        meta = data.meta_info
        if calculate_entropy or "rollout_log_probs" not in data.batch.keys():
            return False
        if router_replay_mode(self.config.actor_rollout_ref.actor) == "R2":  # the forward records the routes
            return False
        if meta.get("old_log_probs_from_rollout") is True:  # the behaviour policy is the old one (no decoupling)
            return True
        return (
            bool(self.config.actor_rollout_ref.actor.use_rollout_log_probs)
            and meta.get("rollout_log_probs_exact") is True
            and meta.get("rollout_log_prob_temperature") == temperature
            and self._rollout_is_current(data)
        )

    def _rollout_is_current(self, data: DataProto) -> bool:
        """Whether the rollout sampled with the actor's current weights: this worker's engine at the
        actor's version, or, for a rollout worker group of its own, every sampled token at the
        version the trainer says is current (``meta_info["policy_version"]``, the async schedule's
        numbering of the weights it pushes)."""
        meta = data.meta_info
        if "policy_version" in meta:
            sampled = data.batch["response_mask"].bool()
            return bool((data.batch["response_versions"][sampled] == int(meta["policy_version"])).all())
        return self._is_rollout and meta.get("rollout_weights_version") == self._weights_version

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """``old_log_probs [B, R]`` (and ``entropys`` when ``meta_info["calculate_entropy"]``,
        ``sum_pi_squared`` when ``meta_info["calculate_sum_pi_squared"]``: those need the actor's
        forward even where the rollout's log-probs are reused as the old ones; and the experts of
        every token, ``routed_experts [B, S, layers, k]``, for an MoE actor under ``router_replay.mode=R2``)."""
        self._require(self._is_actor, "compute_log_prob", "actor")
        timer = self._timer()
        temperature = self._temperature(data)
        calculate_entropy = bool(data.meta_info.get("calculate_entropy", False))
        calculate_sum_pi_squared = bool(data.meta_info.get("calculate_sum_pi_squared", False))
        reuse = self._reuse_rollout_log_probs(data, temperature, calculate_entropy)
        with timer.stage("old_log_prob"):
            tensors = {}
            if not reuse or calculate_sum_pi_squared:
                self.actor_placement.place(params=True, optimizer=self.actor_placement.optimizer_on_device)
                stats = self.actor.compute_log_prob_stats(data, calculate_entropy, calculate_sum_pi_squared)
                tensors = {"old_log_probs": stats["log_probs"]}
                if calculate_entropy:
                    tensors["entropys"] = stats["entropy"]
                if calculate_sum_pi_squared:
                    tensors["sum_pi_squared"] = stats["sum_pi_squared"]
                if ROUTED_EXPERTS in stats:
                    tensors[ROUTED_EXPERTS] = stats[ROUTED_EXPERTS]
            if reuse:
                tensors["old_log_probs"] = data.batch["rollout_log_probs"].clone()
        return self._reply(tensors, {"actor/reused_rollout_log_probs": float(reuse)}, timer, "old_log_prob")

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update_actor(self, data: DataProto) -> DataProto:
        """PPO update on the batch (see ``DataParallelPPOActor.update_policy``); one LR-schedule step."""
        self._require(self._is_actor, "update_actor", "actor")
        timer = self._timer()
        self._temperature(data)
        with timer.stage("update_actor"):
            self.actor_placement.place(params=True, optimizer=True)
            metrics = self.actor.update_policy(data)
            metrics["actor/lr"] = float(self.lr_scheduler.get_last_lr()[0])
            self.lr_scheduler.step()
            self._weights_version += 1
            self._rest_actor()
        return self._reply(None, metrics, timer, "update_actor")

    # ------------------------------------------------------------------ reference
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """``ref_log_prob [B, R]`` under the reference policy."""
        self._require(self._is_ref, "compute_ref_log_prob", "reference")
        timer = self._timer()
        self._temperature(data)
        with timer.stage("ref"):
            if self._ref_shares_actor:
                self.actor_placement.place(params=True, optimizer=self.actor_placement.optimizer_on_device)
                with self.actor_module.disable_adapter():
                    log_probs, _ = self.ref.compute_log_prob(data)
            else:
                with self.ref_model.on_device():
                    log_probs, _ = self.ref.compute_log_prob(data)
        return self._reply({"ref_log_prob": log_probs}, {}, timer, "ref")

    # ------------------------------------------------------------------ checkpoints and export
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        """Write the actor's model, optimizer and LR-scheduler states to the folder ``path``, with its
        config, tokenizer (or processor) and LoRA settings (what ``rlvr.model_merger`` reads)."""
        self._require(self._is_actor, "save_checkpoint", "actor")
        self.actor_placement.place(params=True, optimizer=True)
        if self.rank == 0:
            hf_model = unwrap_hf_model(self.actor_module)
            lora = lora_settings(self.actor_module) if isinstance(self.actor_module, PeftModel) else None
            save_model_files(path, hf_model.config, hf_model.generation_config, self.tokenizer, self.processor, lora)
        save_training_state(path, self.actor_module, self.actor.optimizer, self.lr_scheduler, self.rank,
                            self.world_size)
        self._rest_actor()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        """Restore what :meth:`save_checkpoint` wrote; the rollout picks the weights up."""
        self._require(self._is_actor, "load_checkpoint", "actor")
        self.actor_placement.place(params=True, optimizer=True)
        load_training_state(path, self.actor_module, self.actor.optimizer, self.lr_scheduler, self.rank,
                            self.world_size)
        self._weights_version += 1
        self._rest_actor()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def export_hf(self, path: str) -> None:
        """Write the actor (LoRA merged) and tokenizer (or processor) as a Hugging Face folder at ``path``."""
        self._require(self._is_actor, "export_hf", "actor")
        self.actor_placement.place(params=True, optimizer=self.actor_placement.optimizer_on_device)
        export_hf_model(path, self.actor_module, self.tokenizer, self.rank, self.world_size, self.processor)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def get_actor_weights(self, on_device: bool = False) -> dict[str, torch.Tensor]:
        """The actor's full weights (LoRA merged, plain HF names) on rank 0, ``{}`` on the others;
        what a separate rollout worker's ``update_weights`` takes. A CPU copy, or with ``on_device``
        the tensors where they are (one rank: the actor's own parameters on its GPU, for a CUDA IPC
        push that copies them on the device before the next update; several ranks gather to the CPU)."""
        self._require(self._is_actor, "get_actor_weights", "actor")
        self.actor_placement.place(params=True, optimizer=self.actor_placement.optimizer_on_device)
        state = full_state_dict(self.actor_module, self.world_size)
        if self.rank == 0 and self.config.actor_rollout_ref.model.lora_rank > 0:
            state = merge_lora(state, self.actor_module)
        if on_device:
            return {name: tensor.detach() for name, tensor in state.items()}
        return {name: tensor.detach().to("cpu", copy=True) for name, tensor in state.items()}  # not the live weights

    def _extra_rng_state(self) -> dict:
        return {"rollout": self.rollout.get_rng_state()} if self.rollout is not None else {}

    def _load_extra_rng_state(self, state: dict) -> None:
        if self.rollout is not None:
            self.rollout.set_rng_state(state["rollout"])


class CriticWorker(TrainingWorker):
    """The value model (``critic`` section) and its PPO value update, as its own worker group.

    Args:
        config: the whole run config.
    """

    def __init__(self, config) -> None:
        super().__init__(config, ("critic",))
        self.critic = None

    def _process_group_timeout(self) -> float:
        timeout = self.config.critic.nccl_timeout
        return float(self.config.trainer.call_timeout_s if timeout is None else timeout)

    def _full_determinism(self) -> bool:
        return bool(self.config.critic.fsdp_config.full_determinism)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Load the value model and build its optimizer and schedule."""
        self._setup()
        cfg = self.config.critic
        self.tokenizer = critic_tokenizer(self.config)
        path = cfg.model.path or self.config.actor_rollout_ref.model.path  # schema: None = the actor's model
        seed_role(cfg.fsdp_config)
        module = build_critic(cfg.model, path, dtype=cfg.fsdp_config.model_dtype).to(self.device)
        precision = compute_dtype(cfg.fsdp_config, module)
        module = shard_role_module(module, self.world_size, self._device_type(), cfg.fsdp_config)
        optimizer = build_optimizer(module, cfg.optim)
        self.lr_scheduler = build_lr_scheduler(optimizer, cfg.optim)
        mini = per_rank_batch_size(cfg.ppo_mini_batch_size, self.config.actor_rollout_ref.rollout.n, self.world_size,
                                   "critic.ppo_mini_batch_size")
        self.critic_module = module
        self.critic = DataParallelPPOCritic(cfg, module, optimizer, mini_batch_size=mini,
                                            world_size=self.world_size, device=self.device,
                                            use_remove_padding=cfg.model.use_remove_padding,
                                            sp_size=cfg.ulysses_sequence_parallel_size, compute_dtype=precision)
        self.placement = Placement(module, optimizer, self.device)
        self._rest()

    def _rest(self) -> None:
        """Placement between phases (CPU when offload is configured; GPU only)."""
        fsdp = self.config.critic.fsdp_config
        self.placement.place(params=not fsdp.param_offload, optimizer=not fsdp.optimizer_offload)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_values(self, data: DataProto) -> DataProto:
        """``values [B, R]`` of the response positions."""
        timer = self._timer()
        with timer.stage("values"):
            self.placement.place(params=True, optimizer=self.placement.optimizer_on_device)
            values = self.critic.compute_values(data)
            self._rest()
        return self._reply({"values": values}, {}, timer, "values")

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update_critic(self, data: DataProto) -> DataProto:
        """Clipped value-loss update on the batch; one LR-schedule step."""
        timer = self._timer()
        with timer.stage("update_critic"):
            self.placement.place(params=True, optimizer=True)
            metrics = self.critic.update_critic(data)
            metrics["critic/lr"] = float(self.lr_scheduler.get_last_lr()[0])
            self.lr_scheduler.step()
            self._rest()
        return self._reply(None, metrics, timer, "update_critic")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        """Write the critic's model, optimizer and LR-scheduler states to the folder ``path``, with the
        backbone's config, the tokenizer and LoRA settings (``rlvr.model_merger --is-value-model``)."""
        self.placement.place(params=True, optimizer=True)
        if self.rank == 0:
            backbone = self.critic_module.backbone
            lora = lora_settings(backbone) if isinstance(backbone, PeftModel) else None
            save_model_files(path, self.critic_module.config, None, self.tokenizer, None, lora)
        save_training_state(path, self.critic_module, self.critic.optimizer, self.lr_scheduler, self.rank,
                            self.world_size)
        self._rest()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        """Restore what :meth:`save_checkpoint` wrote."""
        self.placement.place(params=True, optimizer=True)
        load_training_state(path, self.critic_module, self.critic.optimizer, self.lr_scheduler, self.rank,
                            self.world_size)
        self._rest()
