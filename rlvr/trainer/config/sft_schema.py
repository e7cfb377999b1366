"""The typed configuration of the SFT trainer: verl 0.9.1's ``sft_trainer_engine.yaml`` keys.

Sections as verl composes them: ``data``, ``model`` (``hf_model.yaml``), ``engine`` (``fsdp.yaml``),
``optim`` (``optim/fsdp.yaml``), ``checkpoint``, ``profiler``, ``trainer``. Every verl key is
accepted; what each one does in rlvr is in :mod:`rlvr.trainer.config.sft_check` (honoured, refused
with the reason when set to what rlvr cannot do, or a speed switch noted at start-up) and in the
"SFT trainer" table of ``docs/verl_compat.md``. Defaults are verl's, except where the table says
otherwise (``trainer.logger``, ``trainer.device``, ``engine.dtype``, ``data.train_files``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from rlvr.trainer.config.schema import _f, _sub


@dataclass
class SFTCustomClsConfig:
    path: Optional[str] = _f(None, "a .py file or module with your own dataset class (None = rlvr's MultiTurnSFTDataset)")
    name: Optional[str] = _f(None, "the class in it; built as cls(parquet_files, tokenizer, config, processor, max_samples), items with input_ids and loss_mask")


@dataclass
class SFTDataConfig:
    train_batch_size: int = _f(256, "conversations per optimizer step, over all ranks")
    micro_batch_size_per_gpu: int = _f(4, "conversations per forward/backward on one rank (without use_dynamic_bsz); also the validation micro-batch")
    max_token_len_per_gpu: int = _f(8192, "token budget of a micro-batch on one rank with use_dynamic_bsz")
    use_dynamic_bsz: bool = _f(True, "cut micro-batches by token budget (max_token_len_per_gpu) instead of count")
    train_files: Any = _f(None, "training conversations: a parquet/JSONL file or a list of them")
    val_files: Any = _f(None, "held-out conversations for val/loss (None = no validation)")
    train_max_samples: int = _f(-1, "use only the first N training rows (-1 = all)")
    val_max_samples: int = _f(-1, "use only the first N validation rows (-1 = all)")
    messages_key: str = _f("messages", "column with each row's chat messages [{'role', 'content'}, ...]")
    tools_key: str = _f("tools", "column with each row's tool schemas, passed to the chat template (absent column = none)")
    enable_thinking_key: str = _f("enable_thinking", "column with each row's enable_thinking flag for the chat template")
    enable_thinking_default: Any = _f(None, "enable_thinking of rows without the column: true | false | none (verl's default; the template decides)")
    pad_mode: str = _f("no_padding", "no_padding: each micro-batch padded to its longest row (packed with model.use_remove_padding) | right: every row padded to max_length")
    max_length: int = _f(1024, "longest conversation in tokens (see truncation)")
    truncation: str = _f("error", "a longer conversation: error (names the row) | left | right (cut from that side)")
    balance_dp_token: bool = _f(False, "verl's placeholder (not implemented there either); only false is accepted")
    custom_cls: SFTCustomClsConfig = _sub(SFTCustomClsConfig, "your own dataset class")
    use_shm: bool = _f(False, "verl: copy the files to shared memory first (a loading-speed switch; rlvr reads them in place)")
    apply_chat_template_kwargs: dict = _f({}, "extra keyword arguments of the tokenizer's apply_chat_template")
    num_workers: int = _f(8, "verl: DataLoader worker processes (rlvr tokenizes once at load: a speed switch with no effect)")
    ignore_input_ids_mismatch: bool = _f(False, "a conversation whose turns, rendered one by one, do not add up to the whole rendering: false = error naming the row, true = train on the turns' concatenation")


@dataclass
class SFTTiledMLPConfig:
    enabled: bool = _f(False, "verl: tiled MLP (a memory switch; rlvr runs the plain MLP, same numbers)")
    num_shards: int = _f(4, "verl: tiles of the tiled MLP")


@dataclass
class SFTModelConfig:
    path: str = _f("smollm2-135m-instruct", "hub id, local folder, .gguf file or 'smollm2-135m-instruct' (embedded)")
    hf_config_path: Optional[str] = _f(None, "verl: a config other than the model's; rlvr reads the model's own (only null)")
    tokenizer_path: Optional[str] = _f(None, "tokenizer location if different from path")
    use_shm: bool = _f(False, "verl: copy the model to shared memory first (a loading-speed switch)")
    trust_remote_code: bool = _f(False, "allow custom modelling code from the model folder")
    custom_chat_template: Optional[str] = _f(None, "a Jinja chat template replacing the tokenizer's")
    external_lib: Any = _f(None, "a module (or .py file, or a list) of your own imported before the model is built")
    override_config: dict = _f({}, "verl: changes to the model's HF config (only {} in rlvr)")
    enable_gradient_checkpointing: bool = _f(True, "recompute activations in backward to save memory")
    enable_activation_offload: bool = _f(False, "verl: activations to CPU (not in rlvr: only false)")
    use_remove_padding: bool = _f(True, "pack each micro-batch's conversations into one row (no compute on padding; exact)")
    lora_rank: int = _f(0, "LoRA rank; 0 trains all weights")
    lora_alpha: int = _f(16, "LoRA scaling alpha")
    target_modules: Any = _f("all-linear", "LoRA target modules: 'all-linear' or a list of module names")
    exclude_modules: Any = _f(None, "verl: modules kept out of LoRA (only null in rlvr)")
    lora_adapter_path: Optional[str] = _f(None, "verl: start from a saved adapter (only null: merge it first)")
    use_liger: bool = _f(False, "verl: Liger kernels (a speed switch)")
    use_fused_kernels: bool = _f(False, "verl: fused log-prob kernels (a speed switch: rlvr's one-rank path already runs the LM head in chunks)")
    fused_kernel_options: dict = _f({"impl_backend": "torch"}, "verl: options of the fused kernels")
    tiled_mlp: SFTTiledMLPConfig = _sub(SFTTiledMLPConfig, "verl: tiled MLP")
    mtp: dict = _f({"enable": False, "enable_train": False, "enable_rollout": False}, "verl: multi-token prediction (enable: false only); the other keys of verl's mtp section are accepted")
    lora: dict = _f({"rank": 0}, "verl: Megatron's LoRA section (rank 0 only; FSDP LoRA is model.lora_rank); its other keys are accepted")


TURBO_DEFAULTS = {"distributed": {
    "fully_shard_parallel_size": 16, "tensor_parallel_size": 1, "expert_parallel_size": 1,
    "expert_fully_shard_parallel_size": 1, "ulysses_parallel_size": 1,
    "fsdp_plan": {"param_dtype": "bf16", "reduce_dtype": "fp32", "output_dtype": "bf16", "fsdp_implementation": "native",
                  "num_to_forward_prefetch": 1, "num_to_backward_prefetch": 1}}}
"""verl's ``engine.turbo_config`` defaults (settings of an FSDP implementation rlvr does not have)."""


@dataclass
class SFTWrapPolicyConfig:
    min_num_params: int = _f(0, "verl: FSDP1 size-based wrapping (rlvr's FSDP2 shards every decoder block)")


@dataclass
class SFTEngineConfig:
    strategy: str = _f("fsdp", "fsdp | fsdp2 (both PyTorch FSDP2 in rlvr)")
    wrap_policy: SFTWrapPolicyConfig = _sub(SFTWrapPolicyConfig, "verl: FSDP1 wrapping")
    param_offload: bool = _f(False, "keep parameters on CPU between steps (GPU only)")
    optimizer_offload: bool = _f(False, "keep optimizer state on CPU between steps (GPU only)")
    offload_policy: bool = _f(False, "verl: FSDP2 CPUOffloadPolicy (only false; use param_offload)")
    reshard_after_forward: bool = _f(True, "FSDP2 reshard_after_forward")
    fsdp_size: int = _f(-1, "verl: ranks per FSDP group for HSDP (only -1 = all ranks)")
    forward_prefetch: bool = _f(False, "verl: FSDP forward prefetch (a speed switch)")
    model_dtype: str = _f("fp32", "parameter dtype: fp32 | bf16 (float32 | bfloat16)")
    use_orig_params: bool = _f(False, "verl: FSDP1 flat-parameter setting (no meaning in FSDP2)")
    seed: int = _f(42, "seed of the worker (model init of randomly initialised parts, dropout)")
    full_determinism: bool = _f(False, "verl: deterministic kernels (only false: rlvr does not switch them on)")
    ulysses_sequence_parallel_size: int = _f(1, "Ulysses sequence parallelism (needs model.use_remove_padding)")
    entropy_from_logits_with_chunking: bool = _f(False, "verl: chunked entropy (SFT computes none)")
    entropy_from_logits_chunk_size: int = _f(2048, "verl: chunk of the chunked entropy")
    use_torch_compile: bool = _f(True, "verl: torch.compile of kernels (a speed switch with no effect in rlvr's SFT)")
    entropy_checkpointing: bool = _f(False, "verl: recompute the entropy in backward (SFT computes none)")
    use_no_sync_for_gradient_accumulation: bool = _f(False, "verl: skip gradient sync between micro-batches (a speed switch)")
    pad_to_length: bool = _f(False, "verl: pad packed rows to a bucket length for torch.compile (a speed switch)")
    pad_to_length_bucket: int = _f(1024, "verl: that bucket")
    forward_only: bool = _f(False, "verl: an engine without optimizer (only false: the SFT trainer trains)")
    dtype: Optional[str] = _f(None, "compute dtype; null or the model_dtype (rlvr has no mixed-precision compute; verl's default is bfloat16)")
    qat: dict = _f({"enable": False}, "verl: quantisation-aware training (enable: false only); its other keys are accepted")
    turbo_config: dict = _f(TURBO_DEFAULTS, "verl: settings of another FSDP implementation (accepted; a change is noted, it has no effect)")


@dataclass
class SFTOptimConfig:
    optimizer: str = _f("AdamW", "optimizer class (AdamW only)")
    optimizer_impl: str = _f("torch.optim", "module of the optimizer (torch.optim only)")
    lr: float = _f(1e-3, "peak learning rate")
    lr_warmup_steps_ratio: float = _f(0.0, "warmup as a fraction of the total steps (when lr_warmup_steps <= 0)")
    total_training_steps: int = _f(-1, "set by the trainer (epochs x batches, or trainer.total_training_steps)")
    weight_decay: float = _f(0.01, "AdamW weight decay")
    lr_warmup_steps: int = _f(-1, "linear warmup steps (-1 = lr_warmup_steps_ratio)")
    betas: list = _f([0.9, 0.999], "AdamW betas")
    clip_grad: float = _f(1.0, "max global gradient norm; a step with a non-finite norm is skipped")
    min_lr_ratio: float = _f(0.0, "cosine schedule floor as a fraction of lr")
    num_cycles: float = _f(0.5, "cosine waves (0.5 only: one half-cosine down)")
    lr_scheduler_type: str = _f("constant", "constant | cosine (after the warmup)")
    zero_indexed_step: bool = _f(True, "verl: schedule steps counted from 0 (true only)")
    warmup_style: Optional[str] = _f(None, "verl's deprecated name of lr_scheduler_type (overrides it when set)")
    override_optimizer_config: Optional[dict] = _f(None, "verl: extra optimizer arguments (only null)")


@dataclass
class SFTCheckpointConfig:
    save_contents: list = _f(["model", "optimizer", "extra"], "what a checkpoint holds: model, optimizer and extra (always), hf_model (also a Hugging Face folder in <step>/actor/huggingface)")
    load_contents: Any = _f(None, "what a resume restores (null = save_contents; model, optimizer and extra are all restored)")


@dataclass
class SFTProfilerConfig:
    tool: str = _f("torch", "verl: profiler tool")
    enable: bool = _f(False, "verl: profile (only false in rlvr's SFT trainer for now)")
    all_ranks: bool = _f(False, "verl: profile every rank")
    ranks: list = _f([], "verl: ranks to profile")
    save_path: str = _f("outputs/profile", "verl: where traces go")
    relocate_results: bool = _f(False, "verl: move results after the run")
    finish_hook_cmd: Optional[str] = _f(None, "verl: command run after profiling")
    finish_hook_all_ranks: bool = _f(False, "verl: run the hook on every rank")
    finish_hook_ranks: list = _f([], "verl: ranks that run the hook")
    tool_config: dict = _f({}, "verl: per-tool settings")


@dataclass
class SFTTrainerConfig:
    default_local_dir: str = _f("checkpoints/${trainer.project_name}/${trainer.experiment_name}", "run folder: global_step_<k>/ checkpoints, metrics.jsonl, hf_model/")
    default_hdfs_dir: Optional[str] = _f(None, "verl: copy checkpoints to HDFS (only null)")
    project_name: str = _f("gsm8k-sft", "project name (loggers)")
    experiment_name: str = _f("test", "experiment name (loggers)")
    total_epochs: int = _f(4, "passes over the training data")
    total_training_steps: Optional[int] = _f(None, "stop after this many steps (None = epochs x batches)")
    logger: Any = _f(["console", "jsonl"], "metric sinks: console | jsonl | tensorboard | wandb (verl's default adds wandb)")
    seed: int = _f(1, "seed of the data order")
    save_freq: Any = _f(-1, "checkpoint every N steps, or 'after_each_epoch' (-1 = at the end only)")
    test_freq: Any = _f(-1, "val/loss every N steps, or 'after_each_epoch' (-1 = at the end only)")
    max_ckpt_to_keep: Optional[int] = _f(None, "keep only the newest k checkpoints (None = all)")
    balance_batch: bool = _f(True, "verl: not read by verl's SFT trainer either (rows are split evenly over ranks)")
    resume_mode: str = _f("auto", "auto (newest whole checkpoint in default_local_dir) | disable | resume_path")
    resume_from_path: Optional[str] = _f(None, "checkpoint folder (global_step_<k>) for resume_mode=resume_path")
    device: str = _f("auto", "auto | cpu | cuda (verl's default is cuda)")
    nnodes: int = _f(1, "nodes (not under torchrun: ranks = nnodes x n_gpus_per_node)")
    n_gpus_per_node: int = _f(1, "ranks per node (GPUs, or CPU processes)")
    profile_interval: list = _f([-1, -1], "verl: first and last step to profile (only [-1, -1] for now)")
    backend: str = _f("auto", "rlvr: how the ranks run: auto (torchrun's processes when started by torchrun, else local for one rank, process for several on one node, ray for several nodes) | local | process | ray")
    export_hf: bool = _f(True, "rlvr: at the end, write the model to <default_local_dir>/hf_model (loads as actor_rollout_ref.model.path)")
    call_timeout_s: float = _f(3600.0, "rlvr: time limit of one worker call or collective")
    num_threads: Optional[int] = _f(None, "rlvr: torch threads per rank on CPU (None = cores / ranks)")
    progress_bar: bool = _f(True, "rlvr: show a progress bar with ETA")


@dataclass
class SFTConfig:
    """The whole SFT run."""

    data: SFTDataConfig = _sub(SFTDataConfig, "conversations and batch sizes")
    model: SFTModelConfig = _sub(SFTModelConfig, "the model to fine-tune")
    engine: SFTEngineConfig = _sub(SFTEngineConfig, "the training backend (FSDP2)")
    optim: SFTOptimConfig = _sub(SFTOptimConfig, "optimizer and learning-rate schedule")
    checkpoint: SFTCheckpointConfig = _sub(SFTCheckpointConfig, "what checkpoints hold")
    profiler: SFTProfilerConfig = _sub(SFTProfilerConfig, "verl's profiler section")
    trainer: SFTTrainerConfig = _sub(SFTTrainerConfig, "loop, schedule, checkpoints, logging")
