"""verl 0.9 keys that are not settings of rlvr's schema, and what rlvr does with each (standard
library only: the command applies them before torch).

A verl key is either a schema field (rlvr honours it: ``schema.py``), pending in another issue
(:mod:`~rlvr.trainer.config.verl_pending`), or one of these rules:

- ``alias``: another name of a schema field (verl's name, or verl's copy of a value it keeps in two
  places); a value other than verl's default is moved to the field (:data:`ALIASES`).
- ``same``: rlvr does what the key asks by its own means, whatever the value (the reason says how).
- ``derived``: verl fills it from another key; accepted when it equals that key (``source``).
- ``note``: a speed or memory switch for hardware or a library rlvr does not use; accepted, and a
  value other than verl's no-op values prints a one-line start-up note saying it has no effect.
- ``refused``: changes results and rlvr cannot honour it: accepted only at its ``inert`` values
  (or while its ``gate`` says the feature is off), refused with the reason otherwise.

Rule keys are dropped after they are checked: they are not part of the typed config.
``docs/verl_compat.md`` lists every verl key with its status (``scripts/verl_key_table.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

ALL_CONTENTS = ("model", "optimizer", "extra")


@dataclass(frozen=True)
class Rule:
    """What rlvr does with the verl keys matching ``pattern`` (``*`` matches across dots).

    Attributes:
        pattern: dotted-key glob.
        kind: ``same`` | ``derived`` | ``note`` | ``refused``.
        reason: one line: how rlvr covers it (same), why it has no effect (note), what to do
            instead (refused), or what it is copied from (derived).
        inert: values that need no note (note) or that rlvr runs (refused); empty: none.
        gate: ``(key glob, off values)``: while every matching key has an off value (or none is
            set) the feature is off and any value is accepted silently.
        source: derived: the dotted key whose value this one must equal.
    """

    pattern: str
    kind: str
    reason: str
    inert: tuple = ()
    gate: tuple[str, tuple] | None = None
    source: str | None = None


@dataclass(frozen=True)
class Alias:
    """A verl key (or subtree) that is another name of a schema key (subtree).

    Attributes:
        verl: verl's dotted key (a subtree when ``subtree``).
        rlvr: the schema's dotted key.
        default: verl's default; the value is moved only when it differs from it (None for a
            subtree: the schema field's default is used per leaf).
        convert: ``"warmup"``: verl's ``lr_warmup_steps`` (<= 0 = use the ratio) to rlvr's
            ``warmup_steps`` (0 = use the ratio); ``"true_only"``: only ``True`` is moved.
    """

    verl: str
    rlvr: str
    default: Any = None
    subtree: bool = False
    convert: str | None = None


def _same(pattern: str, reason: str) -> Rule:
    return Rule(pattern, "same", reason)


def _note(pattern: str, reason: str, inert: tuple = (), gate: tuple[str, tuple] | None = None) -> Rule:
    return Rule(pattern, "note", reason, inert, gate)


def _refused(pattern: str, reason: str, inert: tuple = (), gate: tuple[str, tuple] | None = None) -> Rule:
    return Rule(pattern, "refused", reason, inert, gate)


def _derived(pattern: str, source: str) -> Rule:
    return Rule(pattern, "derived", f"verl copies it from {source}; rlvr reads {source}", source=source)


ROLES = ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic")
_FSDP = "*.fsdp_config"

ALIASES: tuple[Alias, ...] = (
    Alias("critic.fsdp", "critic.fsdp_config", subtree=True),
    *(Alias(f"sandbox_fusion.{name}", f"reward.sandbox_fusion.{name}") for name in ("url", "max_concurrent",
                                                                                      "memory_limit_mb")),
    *(Alias(f"actor_rollout_ref.actor.{sec}.{name}", f"actor_rollout_ref.actor.{name}", default)
      for sec in ("fsdp_config", "megatron")
      for name, default in (("entropy_from_logits_with_chunking", False), ("entropy_from_logits_chunk_size", 2048))),
    Alias("actor_rollout_ref.actor.fsdp_config.use_torch_compile", "actor_rollout_ref.actor.use_torch_compile", True),
    Alias("actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size",
          "actor_rollout_ref.actor.ulysses_sequence_parallel_size", 1),
    Alias("actor_rollout_ref.ref.fsdp_config.ulysses_sequence_parallel_size",
          "actor_rollout_ref.ref.ulysses_sequence_parallel_size", 1),
    Alias("critic.fsdp_config.ulysses_sequence_parallel_size", "critic.ulysses_sequence_parallel_size", 1),
    *(Alias(f"{role}.optim.{verl}", f"{role}.optim.{ours}", default, convert=convert)
      for role in ("actor_rollout_ref.actor", "critic")
      for verl, ours, default, convert in (("lr_warmup_steps", "warmup_steps", -1, "warmup"),
                                           ("lr_warmup_steps_ratio", "warmup_steps_ratio", 0.0, None),
                                           ("warmup_style", "lr_scheduler_type", None, None))),
    Alias("actor_rollout_ref.rollout.multi_turn.max_tool_response_length",
          "actor_rollout_ref.rollout.multi_turn.max_tool_response_tokens", 256),
    Alias("data.tool_config_path", "actor_rollout_ref.rollout.multi_turn.tool_config_path", None),
    Alias("actor_rollout_ref.actor.use_prefix_grouper", "actor_rollout_ref.actor.share_prompt_forward", False,
          convert="true_only"),
)
"""verl's other names of rlvr's keys."""

_NO_OPTIMIZER = "the reference is frozen and has no optimizer"
_MEGATRON_LIB = "rlvr's Megatron backend runs megatron-core's own modules"

RULES: tuple[Rule, ...] = (
    # ---- engines and libraries rlvr does not use (speed / memory only) -----------------------------
    _note(f"{_FSDP}.wrap_policy.min_num_params", "rlvr wraps every decoder layer as one FSDP2 unit (verl's "
          "default); a size-based wrap only changes memory and speed", (0,)),
    _note(f"{_FSDP}.fsdp_size", "rlvr shards each model over all its ranks (no hybrid-sharded groups); "
          "sharding changes memory and speed, not results", (-1,)),
    _note(f"{_FSDP}.use_orig_params", "an FSDP1 option; rlvr runs FSDP2, which always keeps the original "
          "parameters", (False, True)),
    _note(f"{_FSDP}.use_no_sync_for_gradient_accumulation", "rlvr's FSDP2 reduces gradients every micro-batch; "
          "deferring it only trades memory for communication", (False,)),
    _note(f"{_FSDP}.pad_to_length", "rlvr does not round packed micro-batches up to a bucket (a kernel-shape "
          "speed switch; the padding is stripped before the loss)", (False,)),
    _note(f"{_FSDP}.pad_to_length_bucket", "used only with pad_to_length, which rlvr does not need",
          gate=(f"{_FSDP}.pad_to_length", (False,))),
    _note(f"{_FSDP}.strategy", "verl's FSDP flavour: rlvr runs FSDP2 for fsdp and fsdp2; fsdp_turbo is "
          "a library rlvr does not use, so FSDP2 runs instead", ("fsdp", "fsdp2")),
    _note(f"{_FSDP}.turbo_config.*", "settings of fsdp_turbo, a library rlvr does not use",
          gate=(f"{_FSDP}.strategy", ("fsdp", "fsdp2"))),
    _refused("actor_rollout_ref.actor.*.forward_only", "set by the role in verl: the actor trains", (False,)),
    _refused("critic.*.forward_only", "set by the role in verl: the critic trains", (False,)),
    _refused("actor_rollout_ref.ref.*.forward_only", "set by the role in verl: the reference never trains",
             (True,)),
    _same("actor_rollout_ref.ref.fsdp_config.optimizer_offload", _NO_OPTIMIZER + "; nothing to offload"),
    _same("actor_rollout_ref.ref.megatron.optimizer_offload", _NO_OPTIMIZER + "; nothing to offload"),
    _same("actor_rollout_ref.ref.fsdp_config.entropy_*", "the reference computes log-probs only, no entropy"),
    _same("actor_rollout_ref.ref.megatron.entropy_*", "the reference computes log-probs only, no entropy"),
    _same("actor_rollout_ref.ref.entropy_*", "the reference computes log-probs only, no entropy"),
    _same("actor_rollout_ref.actor.*entropy_checkpointing", "rlvr's entropy always keeps only the logits and "
          "recomputes the probabilities chunk by chunk in backward (what verl's entropy checkpointing does)"),
    _same("critic.fsdp_config.entropy_*", "the critic computes values, no entropy"),
    _same("critic.megatron.entropy_*", "the critic computes values, no entropy"),
    _same("critic.fsdp_config.use_torch_compile", "verl compiles the entropy computation, which the critic "
          "does not run"),
    _same("actor_rollout_ref.ref.fsdp_config.use_torch_compile", "the reference follows "
          "actor_rollout_ref.ref.use_torch_compile"),
    _note("actor_rollout_ref.ref.fsdp_config.pad_to_length*", "rlvr does not round packed micro-batches up to "
          "a bucket (a kernel-shape speed switch)", (False, 1024)),
    _note("actor_rollout_ref.*.pad_to_length", "rlvr does not round packed micro-batches up to a bucket "
          "(a kernel-shape speed switch; the padding is stripped before the loss)", (False,)),
    # ---- quantization-aware training, multi-token prediction, Megatron LoRA -------------------------
    _refused("*.qat.*", "quantization-aware training (NVFP4 fake-quantised linear layers) is not in rlvr; "
             "train in bf16/fp32 (set qat.enable=false); rollout.quantization=fp8 quantises the rollout only",
             gate=("*.qat.enable", (False,))),
    _same("actor_rollout_ref.rollout.qat", "the rollout follows the actor's qat section (refused when enabled)"),
    _refused("*.model.mtp.*", "multi-token prediction (MTP) heads are not in rlvr; set model.mtp.enable=false",
             gate=("*.model.mtp.enable", (False,))),
    _same("actor_rollout_ref.rollout.mtp", "the rollout follows model.mtp (refused when enabled)"),
    _note("*.model.lora.merge", "rlvr's rollout engines always take the merged weights W + (alpha/rank) B A (the "
          "model the adapters give; verl's false sends the adapters to vLLM instead, the same model)", (True,),
          gate=("*.model.lora.rank", (0,))),
    _note("*.model.lora.a2a_experimental", "an all-to-all communication switch of Megatron-Bridge's adapters on "
          "expert layers (rlvr adapts dense layers)", (False,), gate=("*.model.lora.rank", (0,))),
    _refused("*.model.lora.adapter_path", "rlvr starts Megatron LoRA adapters fresh; to continue a run, resume its "
             "rlvr checkpoint (trainer.resume_mode), or merge the adapters into the model first", (None,),
             gate=("*.model.lora.rank", (0,))),
    _same("*.model.lora.freeze_*", "read only by Megatron-Bridge's vlm_lora type (refused); with lora and "
          "canonical_lora the base model is frozen and only the adapters train, whatever the value"),
    _note("*.model.use_liger", "Liger kernels are a library rlvr does not use (the same math in "
          "transformers' modules; model.use_fused_kernels fuses the log-prob head)", (False,)),
    _note("*.model.use_shm", "rlvr loads the model from its path; a copy in /dev/shm only speeds up loading",
          (False,)),
    _note("*.model.enable_activation_offload", "activation offload to CPU is a GPU memory switch rlvr does "
          "not have (model.enable_gradient_checkpointing saves activation memory)", (False,)),
    _note("*.model.tiled_mlp.*", "tiled MLP is a memory switch (the same MLP in tiles); rlvr runs the MLP whole",
          gate=("*.model.tiled_mlp.enabled", (False,))),
    _note("*.model.fused_kernel_options.impl_backend", "rlvr's fused log-prob head is its own torch "
          "implementation (chunked over the vocabulary); triton / liger kernels are libraries it does not use",
          ("torch",)),
    _refused("*.model.hf_config_path", "rlvr reads the model's config from model.path; give a model folder with "
             "its config (or set model.override_config for single values)", (None,)),
    _refused("*.model.lora_adapter_path", "rlvr starts LoRA adapters fresh (model.lora_rank); to continue from "
             "saved adapters, merge them into the model first (peft merge_and_unload) or resume an rlvr "
             "checkpoint", (None,)),
    # ---- Megatron ------------------------------------------------------------------------------
    _note("*.megatron.dist_ckpt_optim_fully_reshardable", "a checkpoint-format switch of Megatron's "
          "distributed optimizer; rlvr writes its own checkpoint format", (False,)),
    _note("*.megatron.distrib_optim_fully_reshardable_mem_efficient", "a checkpoint-format switch of "
          "Megatron's distributed optimizer; rlvr writes its own checkpoint format", (False,)),
    _note("*.megatron.use_distributed_optimizer", "rlvr keeps fp32 Adam states per rank (the same update as "
          "Megatron's distributed optimizer, which only shards them to save memory)", (True, False)),
    _note("*.megatron.use_megatron_fsdp", "Megatron-FSDP (ZeRO-3 sharding) is a memory switch; rlvr's Megatron "
          "backend shards by tensor/pipeline parallelism", (False,)),
    _note("*.megatron.override_ddp_config*", "bucket and overlap settings of Megatron's DDP wrapper, which rlvr's "
          "Megatron backend does not use (it reduces gradients itself)", ({},)),
    _refused("*.megatron.override_mcore_model_config*", "rlvr builds the GPT model from the HF config; pass "
             "TransformerConfig fields in megatron.override_transformer_config", ({},)),
    _note("*.megatron.pad_bshd_to_minibatch_max", "a kernel-shape speed switch (padding is masked out)",
          (True, False)),
    _note("*.megatron.pad_to_length*", "a kernel-shape speed switch (padding is stripped before the loss)",
          (False, 512)),
    _note("*.megatron.override_transformer_config.attention_backend", "rlvr's Megatron backend runs megatron-core's "
          "local attention (the same math as flash / fused kernels, which need transformer-engine)",
          ("flash", "auto", "local", "unfused", "fused")),
    _note("*.megatron.sequence_parallel", "splits the layer-norm and dropout activations of the tensor-parallel "
          "regions along the sequence (memory; the same values); rlvr's Megatron backend keeps them whole",
          (False,), gate=("*.megatron.tensor_model_parallel_size", (1, None))),
    _note("*.megatron.virtual_pipeline_model_parallel_size", "interleaves model chunks in the 1F1B pipeline "
          "schedule (speed; the same values); rlvr runs each micro-batch through the stages in order", (None, 1)),
    _same("*.megatron.grad_offload", "rlvr frees the gradients after every optimizer step "
          "(zero_grad(set_to_none=True)), so no gradient buffer is held between phases"),
    _same("*.megatron.use_remove_padding", "packing is exact; rlvr's Megatron backend follows "
          "model.use_remove_padding"),
    _same("*.megatron.use_mbridge", "rlvr's own HF <-> Megatron converter loads and exports the weights "
          "(the same tensors as Megatron-Bridge)"),
    _same("*.megatron.vanilla_mbridge", "rlvr's own HF <-> Megatron converter loads and exports the weights"),
    _same("*.checkpoint.mbridge_config*", "rlvr's own HF <-> Megatron converter writes the checkpoints"),
    # ---- optimizer (Megatron's) ------------------------------------------------------------------
    _refused("*.optim.muon_*", "the Muon optimizer is not in rlvr (optim.optimizer=adamw)",
             gate=("*.optim.optimizer", ("AdamW", "adamw", "adam", "Adam"))),
    _refused("*.optim.exp_avg_dtype", "rlvr keeps Adam's moments in fp32", ("fp32", "float32")),
    _refused("*.optim.exp_avg_sq_dtype", "rlvr keeps Adam's moments in fp32", ("fp32", "float32")),
    _refused("*.optim.main_grads_dtype", "rlvr accumulates gradients in the parameters' dtype (fp32 master "
             "weights)", ("fp32", "float32")),
    _refused("*.optim.use_precision_aware_optimizer", "rlvr's optimizer keeps fp32 states (set it to false)",
             (False,)),
    _note("*.optim.use_layer_wise_distributed_optimizer", "a memory switch of Megatron's distributed optimizer",
          (False,)),
    _refused("*.optim.weight_decay_incr_style", "rlvr keeps weight_decay constant", ("constant",)),
    _same("*.optim.use_checkpoint_opt_param_scheduler", "rlvr always restores the schedule with the optimizer "
          "from a checkpoint"),
    # ---- checkpoints -----------------------------------------------------------------------------
    _note("*.checkpoint.async_save", "rlvr writes checkpoints synchronously (atomically, manifest last)",
          (False,)),
    _refused("*.checkpoint.strict", "rlvr loads checkpoints strictly (every key must match)", (True,)),
    # ---- rollout ---------------------------------------------------------------------------------
    _derived("*.rollout_n", "actor_rollout_ref.rollout.n"),
    _derived("actor_rollout_ref.actor.use_remove_padding", "actor_rollout_ref.model.use_remove_padding"),
    _refused("actor_rollout_ref.rollout.logprobs_mode", "rlvr's rollout log-probs are of the sampling "
             "distribution after temperature (verl's processed_logprobs); the actor and the rollout-correction "
             "compare against exactly those", ("processed_logprobs",)),
    _note("actor_rollout_ref.rollout.layered_summon", "gathers FSDP weights layer by layer for the rollout "
          "(memory); rlvr gathers one parameter at a time already", (False,)),
    _note("actor_rollout_ref.rollout.multi_stage_wake_up", "an SGLang memory switch; rlvr's engines are HF "
          "and vLLM", (False,)),
    _note("actor_rollout_ref.rollout.skip_tokenizer_init", "vLLM without its tokenizer (token ids in, ids "
          "out) only saves start-up time; rlvr's vLLM engine needs it for stop strings", (True, False)),
    _note("actor_rollout_ref.rollout.agent.num_workers", "verl's agent-loop worker processes; rlvr runs the "
          "agent loops inside each rollout worker", (8,)),
    _note("actor_rollout_ref.rollout.engine_kwargs.sglang*", "SGLang is a library rlvr does not use", ({}, None)),
    _note("actor_rollout_ref.rollout.engine_kwargs.trtllm*", "TensorRT-LLM is a library rlvr does not use",
          ({}, None)),
    _note("actor_rollout_ref.rollout.disaggregation.*", "prefill/decode disaggregation across replicas is a "
          "serving speed switch rlvr does not have", gate=("actor_rollout_ref.rollout.disaggregation.enabled",
                                                            (False,))),
    _note("actor_rollout_ref.rollout.prometheus.*", "Prometheus export of the rollout servers' metrics is not "
          "in rlvr (its metrics go to trainer.logger)",
          gate=("actor_rollout_ref.rollout.prometheus.enable", (False,))),
    _note("actor_rollout_ref.rollout.trace.*", "rollout traces to weave / mlflow are libraries rlvr does not "
          "use (sample generations are in the run report)",
          gate=("actor_rollout_ref.rollout.trace.backend", (None,))),
    _refused("actor_rollout_ref.rollout.over_sample_rate", "rlvr waits for every sample of a batch (ending "
             "the slowest requests early drops their prompts and changes the batch)", (0, 0.0)),
    _refused("actor_rollout_ref.rollout.router_config_path", "rlvr's server engine routes requests itself "
             "(rollout.server)", (None,)),
    _refused("actor_rollout_ref.rollout.quantization_config_file", "rlvr's rollout quantization is "
             "rollout.quantization=fp8 with no extra file", (None,)),
    _refused("actor_rollout_ref.rollout.agent.agent_loop_config_path", "register your agent loop in Python "
             "(rlvr.agent.register_agent_loop, in a module named in trainer.user_modules) and name it in "
             "rollout.agent.default_agent_loop or the data's agent_name column", (None,)),
    _refused("actor_rollout_ref.rollout.agent.custom_async_server.*", "rlvr's server engine is vLLM's OpenAI "
             "server (rollout.mode=async); register another engine with rlvr.workers.rollout."
             "register_rollout_engine", (None,)),
    _refused("actor_rollout_ref.rollout.multi_turn.function_tool_path", "declare tools in the YAML of "
             "rollout.multi_turn.tool_config_path (see docs/agents.md)", (None,)),
    _refused("actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts", "rlvr samples rollout.n responses per "
             "prompt; set rollout.n", (None,)),
    _refused("actor_rollout_ref.rollout.multi_turn.use_inference_chat_template", "rlvr renders every turn with "
             "the tokenizer's chat template as trained", (False,)),
    _same("actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode", "rlvr builds trajectories from "
          "token ids and never re-tokenises, so there is nothing to check"),
    _same("actor_rollout_ref.rollout.multi_turn.enable", "rlvr's agent loop decides: tool_agent / env_agent "
          "(rollout.agent.default_agent_loop or the data's agent_name) run several turns"),
    _refused("actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module", "rlvr's weight pushes are its "
             "own (rollout.checkpoint_engine.backend maps verl's backends onto them)", (None,)),
    _note("actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes", "rlvr pushes one "
          "parameter at a time (no buckets to size)", (2048,)),
    _note("actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs*", "options of verl's transfer engines; rlvr "
          "pushes weights its own way", ({},)),
    # ---- data ------------------------------------------------------------------------------------
    _note("data.dataloader_num_workers", "rlvr tokenizes the prompts once when the dataset loads and builds each "
          "batch in the driver, so there are no DataLoader workers", (8, 0)),
    _note("data.use_shm", "rlvr reads the data files from their paths; a copy in /dev/shm only speeds up loading",
          (False,)),
    _derived("data.function_tool_path", "actor_rollout_ref.rollout.multi_turn.function_tool_path"),
    _refused("data.tokenizer", "rlvr tokenizes the data with the policy's tokenizer (model.tokenizer_path)",
             (None,)),
    _refused("data.gen_batch_size", "rlvr's dynamic sampling draws train_batch_size prompts per generation round "
             "(algorithm.filter_groups.max_num_gen_batches bounds the rounds); remove data.gen_batch_size", (None,)),
    _same("data.return_full_prompt", "rlvr keeps the prompt messages (raw_prompt) and ids in every batch"),
    _refused("data.return_multi_modal_inputs", "rlvr always passes the processor's image inputs to the model",
             (True,)),
    _refused("data.image_patch_size", "rlvr uses the model processor's own patch size", (14, None)),
    _same("data.validation_shuffle", "validation metrics are averages over the whole set, so its order does "
          "not matter"),
    # ---- algorithm -------------------------------------------------------------------------------
    _note("algorithm.filter_groups.max_inflight_gen_batches", "rlvr generates DAPO's extra batches one after "
          "the other", (1,)),
    _refused("algorithm.use_pf_ppo", "PF-PPO's reward-weighted resampling is not in rlvr", (False,)),
    _refused("algorithm.pf_ppo.*", "PF-PPO's reward-weighted resampling is not in rlvr",
             gate=("algorithm.use_pf_ppo", (False,))),
    # ---- trainer ---------------------------------------------------------------------------------
    _same("trainer.use_v1", "rlvr has one trainer; verl's v1 and legacy trainers run the same algorithm"),
    _refused("trainer.v1.trainer_mode", "rlvr's asynchronous schedules are async_training.mode=one_step | "
             "bounded with actor_rollout_ref.hybrid_engine=false (docs/async.md)", ("sync",)),
    _refused("trainer.v1.*", "settings of verl's asynchronous v1 trainer modes; use async_training "
             "(docs/async.md)", gate=("trainer.v1.trainer_mode", ("sync",))),
    _same("transfer_queue.*", "verl's TransferQueue moves batches between verl's workers; rlvr sends them "
          "as DataProto"),
    _refused("skip.*", "replaying dumped rollouts is not in rlvr", gate=("skip.*.enable", (False,))),
    _note("trainer.default_hdfs_dir", "rlvr writes checkpoints to trainer.default_local_dir only; copy them to "
          "HDFS yourself", (None,)),
    _refused("trainer.del_local_ckpt_after_load", "rlvr never deletes a checkpoint it loads", (False,)),
    _note("trainer.esi_redundant_time", "saving before an elastic instance expires is a cluster feature rlvr "
          "does not have (trainer.save_freq sets the checkpoints)", (0,)),
    _refused("trainer.checkpoint_callback_class", "rlvr runs no checkpoint callbacks; watch "
             "<run dir>/checkpoints for new manifests", (None,)),
    _same("trainer.ray_wait_register_center_timeout", "rlvr's worker start is bounded by "
          "trainer.call_timeout_s"),
    _refused("ray_kwargs.ray_init.runtime_env.*", "rlvr's Ray workers run the driver's Python", (None,)),
    _note("ray_kwargs.timeline_json_file", "rlvr does not write a Ray timeline (per-stage timings are in the "
          "metrics)", (None,)),
    # profiling a token range of a rollout server's generation (verl's agent-loop servers)
    _refused("actor_rollout_ref.rollout.profiler.tool_config.*.profile_token_*", "rlvr's rollout profiler traces "
             "whole rollout stages (docs/profiling.md); profiling a token range of a server's generation is not in "
             "rlvr", (None,)),
    # reward models
    _same("data.return_raw_input_ids", "rlvr's reward-model worker decodes each sample and tokenises it with the "
          "reward model's own tokenizer and chat template, whatever the value"),
)
"""Every rule, by section."""


_ENGINE_NOTE = ("{value} is an inference library rlvr does not ship; rlvr's vLLM engine runs instead (the same "
                "sampling of the same policy; engine_kwargs.{value} does not apply)")
VALUE_ALIASES: dict[str, dict[Any, tuple[Any, str | None]]] = {
    "actor_rollout_ref.rollout.name": {"sglang": ("vllm", _ENGINE_NOTE.format(value="sglang")),
                                       "trtllm": ("vllm", _ENGINE_NOTE.format(value="trtllm"))},
}
"""verl's values of a schema field that rlvr names otherwise: ``key -> {verl value: (rlvr value,
start-up note or None)}``."""


def _matches(key: str, pattern: str) -> bool:
    return fnmatchcase(key, pattern)


def rule_for(key: str) -> Rule | None:
    """The rule of a dotted verl key, or None."""
    return next((rule for rule in RULES if _matches(key, rule.pattern)), None)


def alias_for(key: str) -> tuple[Alias, str] | None:
    """The alias a dotted key falls under and the schema key it names, or None."""
    for alias in ALIASES:
        if key == alias.verl:
            return alias, alias.rlvr
        if alias.subtree and key.startswith(alias.verl + "."):
            return alias, alias.rlvr + key[len(alias.verl):]
    return None


def gate_off(gate: tuple[str, tuple] | None, values: dict[str, Any]) -> bool:
    """Whether every key of the gate that is set has an off value (an unset gate key is off)."""
    if gate is None:
        return False
    pattern, off = gate
    return all(value in off for key, value in values.items() if _matches(key, pattern))
