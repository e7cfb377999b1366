"""The typed configuration schema of an rlvr run.

Every field has a default and a one-line help text (``metadata["help"]``); ``rlvr --help-config``
prints them. The layout follows verl's ``ppo_trainer.yaml`` so that verl users find their keys:
``data``, ``actor_rollout_ref.{model,actor,ref,rollout}``, ``critic``, ``reward_model``,
``custom_reward_function``, ``algorithm``, ``trainer``. Batch sizes are counted in prompts unless the
name says otherwise (``*_per_gpu`` counts sequences on one worker).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from rlvr.reward.config import RewardConfig


def _f(default: Any, help: str) -> Any:  # noqa: A002 - "help" is the metadata key we document
    """A dataclass field with a default (lists/dicts copied per instance) and a help string."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata={"help": help})
    return field(default=default, metadata={"help": help})


def _sub(cls: type, help: str) -> Any:
    """A nested config section."""
    return field(default_factory=cls, metadata={"help": help})


# --------------------------------------------------------------------------------------------- data
@dataclass
class DataConfig:
    train_files: Any = _f(None, "training data: a parquet/JSONL path or a list of them (common RL format)")
    val_files: Any = _f(None, "held-out data for validation: a path or list; None disables validation")
    prompt_key: str = _f("prompt", "column holding the chat messages of the prompt")
    max_prompt_length: int = _f(256, "prompts longer than this many tokens are filtered (see filter_overlong_prompts)")
    max_response_length: int = _f(128, "maximum number of generated tokens per response")
    train_batch_size: int = _f(8, "prompts per training step (each sampled rollout.n times)")
    val_batch_size: Optional[int] = _f(None, "prompts per validation generation batch; None = whole set at once")
    val_max_samples: Optional[int] = _f(None, "use only the first N validation prompts (None = all)")
    shuffle: bool = _f(True, "shuffle the training data every epoch (seeded by data.seed)")
    seed: Optional[int] = _f(None, "seed of the data order (None = trainer.seed)")
    filter_overlong_prompts: bool = _f(True, "drop prompts longer than max_prompt_length (count is logged)")
    truncation: str = _f("error", "if a prompt is still too long: error | left | right")
    apply_chat_template: bool = _f(True, "render the prompt messages with the tokenizer's chat template")


# ---------------------------------------------------------------------------------- model / optim
@dataclass
class ModelConfig:
    path: str = _f("smollm2-135m-instruct", "hub id, local directory, .gguf file or 'smollm2-135m-instruct' (embedded)")
    tokenizer_path: Optional[str] = _f(None, "tokenizer location if different from path")
    dtype: str = _f("float32", "parameter dtype for training: float32 | bfloat16")
    attn_implementation: Optional[str] = _f(None, "transformers attention kernel: sdpa | eager | flash_attention_2 (None = default)")
    enable_gradient_checkpointing: bool = _f(False, "recompute activations in backward to save memory")
    trust_remote_code: bool = _f(False, "allow custom modelling code from the model directory")
    lora_rank: int = _f(0, "LoRA rank; 0 trains all weights")
    lora_alpha: int = _f(16, "LoRA scaling alpha")
    lora_dropout: float = _f(0.0, "LoRA dropout")
    target_modules: Any = _f("all-linear", "LoRA target modules: 'all-linear' or a list of module names")


@dataclass
class OptimConfig:
    lr: float = _f(1e-6, "peak learning rate of AdamW")
    betas: list = _f([0.9, 0.999], "AdamW betas")
    eps: float = _f(1e-8, "AdamW epsilon")
    weight_decay: float = _f(0.01, "AdamW weight decay")
    warmup_steps: int = _f(0, "linear warmup steps (takes precedence over warmup_steps_ratio when > 0)")
    warmup_steps_ratio: float = _f(0.0, "warmup as a fraction of the total training steps")
    lr_scheduler_type: str = _f("constant", "learning-rate schedule after warmup: constant | cosine")
    min_lr_ratio: float = _f(0.0, "cosine schedule floor as a fraction of lr")
    total_training_steps: int = _f(-1, "set by the trainer from the data; used by the schedule")


@dataclass
class RefFSDPConfig:
    """The frozen reference's FSDP settings: it has no optimizer, so no ``optimizer_offload``."""

    param_offload: bool = _f(False, "keep parameters on CPU between phases (GPU only)")
    reshard_after_forward: bool = _f(True, "FSDP2 reshard_after_forward")


@dataclass
class FSDPConfig(RefFSDPConfig):
    """A trained model's FSDP settings: the reference's and its optimizer's offload."""

    optimizer_offload: bool = _f(False, "keep optimizer state on CPU between phases (GPU only)")


# ------------------------------------------------------------------------------------------ actor
@dataclass
class PolicyLossConfig:
    """The loss-specific knobs of the registered policy losses; the clip ratios they share are
    fields of the actor section (a loss is called with ``config`` = the whole actor section)."""

    loss_mode: str = _f("vanilla", "policy loss from the registry: vanilla | gspo | gpg | cispo | clip_cov | kl_cov | geo_mean")
    clip_cov_ratio: float = _f(0.0002, "clip_cov: fraction of valid tokens whose gradient is cut (> 0)")
    clip_cov_lb: float = _f(1.0, "clip_cov: lower covariance bound of the candidate tokens")
    clip_cov_ub: float = _f(5.0, "clip_cov: upper covariance bound of the candidate tokens")
    kl_cov_ratio: float = _f(0.0002, "kl_cov: fraction of valid tokens that get the |log-ratio| penalty (> 0)")
    ppo_kl_coef: float = _f(0.1, "kl_cov: coefficient of the per-token |log-ratio| penalty")


STRATEGIES = ("fsdp", "fsdp2")
"""Training backends a verl config may name; both run PyTorch FSDP2 over the worker group."""

AGG_LOSS_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
"""The loss aggregation modes of ``agg_loss`` (``actor.loss_agg_mode``, ``critic.loss_agg_mode``)."""

SINGLETON_CHOICES = ("score", "zero")
"""What a group estimator gives a prompt's only sample (``algorithm.singleton_advantage``)."""

GPG_ALPHA_COUNTS = ("nonzero_score", "informative")
"""How GPG counts the samples of its alpha correction (``algorithm.gpg_alpha_count``)."""


@dataclass
class ActorConfig:
    strategy: str = _f("fsdp2", "training backend: fsdp | fsdp2 (both shard with PyTorch FSDP2 over the worker group)")
    ppo_mini_batch_size: int = _f(8, "prompts per optimizer step (times rollout.n sequences)")
    ppo_micro_batch_size_per_gpu: int = _f(8, "sequences per forward/backward on one worker (gradient accumulation)")
    use_dynamic_bsz: bool = _f(False, "size micro-batches by token budget instead of sequence count")
    ppo_max_token_len_per_gpu: int = _f(16384, "token budget of a micro-batch when use_dynamic_bsz")
    ppo_epochs: int = _f(1, "passes over each batch")
    shuffle: bool = _f(False, "shuffle sequences between mini-batches")
    grad_clip: float = _f(1.0, "max global gradient norm; a step with a non-finite norm is skipped")
    clip_ratio: float = _f(0.2, "clip epsilon of every loss that clips (default for low and high)")
    clip_ratio_low: Optional[float] = _f(None, "lower clip epsilon (None = clip_ratio); gspo: sequence ratio, cispo: IS weight, geo_mean: log-ratio")
    clip_ratio_high: Optional[float] = _f(None, "upper clip epsilon (None = clip_ratio; DAPO uses 0.28, GSPO 4e-4)")
    clip_ratio_c: float = _f(3.0, "dual-clip lower bound for negative advantages (> 1)")
    loss_agg_mode: str = _f("token-mean", "token-mean | token-sum | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm")
    entropy_coeff: float = _f(0.0, "entropy bonus coefficient")
    use_kl_loss: bool = _f(False, "add a KL(actor || ref) term to the loss (GRPO style); needs the reference")
    kl_loss_coef: float = _f(0.001, "coefficient of the KL loss")
    kl_loss_type: str = _f("low_var_kl", "KL estimator of the loss: kl | abs | mse | low_var_kl (k1 | k2 | k3, '+' = k2 gradient)")
    policy_loss: PolicyLossConfig = _sub(PolicyLossConfig, "policy-loss registry settings")
    global_batch_info: dict = _f({}, "set by the worker, not by users: agg_loss's dp_size/batch_num_tokens/global_batch_size ({} = per micro-batch)")
    optim: OptimConfig = _sub(OptimConfig, "optimizer and schedule")
    fsdp_config: FSDPConfig = _sub(FSDPConfig, "FSDP2 and offload settings")
    share_prompt_forward: bool = _f(True, "on one rank, run each distinct prompt of a micro-batch once and its responses on its KV cache (exact; about n times less prompt compute)")
    use_rollout_log_probs: bool = _f(True, "reuse the rollout's exact sampling log-probs as old_log_probs when they match the actor (skips a forward pass)")


@dataclass
class RefConfig:
    log_prob_micro_batch_size_per_gpu: int = _f(16, "sequences per forward when computing reference log-probs")
    fsdp_config: RefFSDPConfig = _sub(RefFSDPConfig, "FSDP2 and offload settings")


@dataclass
class SamplingConfig:
    temperature: float = _f(0.0, "validation sampling temperature (0 = greedy)")
    top_p: float = _f(1.0, "validation nucleus sampling")
    top_k: int = _f(-1, "validation top-k (-1 = off)")
    do_sample: bool = _f(False, "sample during validation (False = greedy)")
    n: int = _f(1, "samples per validation prompt")


@dataclass
class AgentConfig:
    default_agent_loop: str = _f("single_turn", "agent loop (registry) for rows without an agent_name field: single_turn | tool_agent | env_agent")


@dataclass
class MultiTurnConfig:
    max_assistant_turns: int = _f(4, "most model turns in one multi-turn rollout (tool_agent, env_agent)")
    max_tool_response_tokens: int = _f(256, "an inserted tool result or environment reply is cut to this many tokens")
    tool_config_path: Optional[str] = _f(None, "YAML file of the tools of tool_agent (see rlvr.agent.tools)")
    format: str = _f("hermes", "tool-call parser (registry): hermes = <tool_call>{json}</tool_call>")
    stop_after_tool_call: bool = _f(True, "end a model turn right after a complete tool call (the parser's stop strings)")
    max_parallel_calls: int = _f(1, "tool calls run per model turn; further calls in the turn get an error message")
    tool_timeout_s: float = _f(30.0, "time limit of one turn's tool calls (all samples together); a late call becomes an error message")
    env_name: Optional[str] = _f(None, "environment (registry) of the env_agent loop, e.g. retry")
    env_kwargs: dict = _f({}, "keyword arguments of the environment's constructor")


@dataclass
class RolloutConfig:
    name: str = _f("hf", "rollout engine from the registry: hf (transformers) | vllm (vLLM's LLM in the worker's process; `make setup-vllm`)")
    n: int = _f(8, "responses sampled per prompt")
    temperature: float = _f(1.0, "sampling temperature")
    top_p: float = _f(1.0, "nucleus sampling threshold (vllm: 1.0 only, its log-probs would be renormalised)")
    top_k: int = _f(-1, "top-k sampling (-1 = off; vllm: off only, its log-probs would be renormalised)")
    do_sample: bool = _f(True, "sample (False = greedy)")
    response_length: int = _f(128, "max new tokens; always set from data.max_response_length by load_config")
    prompt_length: int = _f(256, "max prompt tokens; always set from data.max_prompt_length by load_config")
    stop: list = _f([], "stop strings that end a response (in addition to EOS)")
    ignore_eos: bool = _f(False, "keep generating after EOS (benchmarks force full-length responses)")
    micro_batch_size: int = _f(256, "sequences generated together on one worker")
    log_prob_micro_batch_size_per_gpu: int = _f(16, "sequences per forward for compute_log_prob")
    static_cache: bool = _f(False, "use a static KV cache (GPU fast path)")
    compile: bool = _f(False, "torch.compile the decode step (GPU fast path, with static_cache)")
    free_cache_engine: bool = _f(True, "free the rollout's KV cache after generation (vllm: sleep between phases, GPU only)")
    quantization: Optional[str] = _f(None, "rollout weights: fp8 (hf: e4m3 linear layers, per-channel scales, re-quantised at every weight sync; vllm: its quantization='fp8') | null = off")
    val_kwargs: SamplingConfig = _sub(SamplingConfig, "sampling settings for validation")
    dtype: Optional[str] = _f(None, "vllm: dtype of the engine's weights: float32 | bfloat16 (None = model.dtype)")
    gpu_memory_utilization: float = _f(0.5, "vllm: share of GPU memory for weights and KV cache (the actor lives beside it)")
    tensor_model_parallel_size: int = _f(1, "vllm: tensor-parallel ranks per engine (1: one engine per worker)")
    enforce_eager: bool = _f(True, "vllm: no CUDA graphs / compilation (fast start; False compiles for speed)")
    enable_prefix_caching: bool = _f(True, "vllm: reuse the KV cache of shared prompt prefixes (the n samples of a prompt)")
    enable_sleep_mode: bool = _f(True, "vllm: free weights and KV cache between phases on GPU (sleep/wake_up); no-op on CPU")
    max_num_batched_tokens: Optional[int] = _f(None, "vllm: token budget of one engine step (None = vLLM's default)")
    max_num_seqs: int = _f(256, "vllm: most sequences decoded together")
    load_format: str = _f("dummy", "vllm: the engine's first weights: dummy (random; the actor's are loaded in place before the first generation) | auto (read from the model folder)")
    kv_cache_memory_bytes: Optional[int] = _f(None, "vllm: KV-cache size in bytes (None = gpu_memory_utilization on GPU, 1 GiB on CPU)")
    block_size: Optional[int] = _f(None, "vllm: KV-cache block in tokens (None = 32 on CPU, where the default 128 outgrows short prompts; vLLM's default on GPU)")
    agent: AgentConfig = _sub(AgentConfig, "agent loops above the engine (single-turn, tools, environments)")
    multi_turn: MultiTurnConfig = _sub(MultiTurnConfig, "limits, tools and environment of multi-turn agent loops")


@dataclass
class ActorRolloutRefConfig:
    hybrid_engine: bool = _f(True, "actor, rollout and reference share one worker group (the only layout rlvr runs; false is rejected)")
    model: ModelConfig = _sub(ModelConfig, "the policy model")
    actor: ActorConfig = _sub(ActorConfig, "policy training")
    ref: RefConfig = _sub(RefConfig, "reference policy")
    rollout: RolloutConfig = _sub(RolloutConfig, "generation")


# ----------------------------------------------------------------------------------------- critic
@dataclass
class CriticModelConfig(ModelConfig):
    path: Optional[str] = _f(None, "critic model location (LM with a scalar value head); None = the actor's model.path")
    tokenizer_path: Optional[str] = _f(None, "critic's tokenizer; it reads the policy's token ids, so it must have the policy's vocabulary (None = the policy's tokenizer)")


@dataclass
class CriticConfig:
    enable: Optional[bool] = _f(None, "use a critic (None = when the estimator's registry entry needs one, e.g. gae)")
    strategy: str = _f("fsdp2", "training backend: fsdp | fsdp2 (both shard with PyTorch FSDP2 over the worker group)")
    model: CriticModelConfig = _sub(CriticModelConfig, "critic model; unset fields follow the actor's model")
    optim: OptimConfig = _sub(OptimConfig, "critic optimizer")
    ppo_mini_batch_size: int = _f(8, "prompts per critic optimizer step")
    ppo_micro_batch_size_per_gpu: int = _f(8, "sequences per critic forward/backward")
    ppo_epochs: int = _f(1, "critic passes over each batch")
    cliprange_value: float = _f(0.5, "value clipping range")
    grad_clip: float = _f(1.0, "max gradient norm of the critic")
    loss_agg_mode: str = _f("token-mean", "aggregation of the value loss (see actor.loss_agg_mode)")
    fsdp_config: FSDPConfig = _sub(FSDPConfig, "FSDP2 and offload settings")


# ----------------------------------------------------------------------------------------- reward
@dataclass
class OverlongBufferConfig:
    enable: bool = _f(False, "DAPO overlong-buffer length penalty")
    len: int = _f(0, "length of the buffer before max_resp_len where the penalty ramps up")
    penalty_factor: float = _f(1.0, "penalty at max_resp_len")
    log: bool = _f(False, "log the penalty per sample")


@dataclass
class RewardModelConfig:
    reward_manager: str = _f("naive", "reward manager from the registry: naive | dapo | batch | parallel")
    reward_kwargs: dict = _f({}, "extra keyword arguments for the reward manager")
    overlong_buffer: OverlongBufferConfig = _sub(OverlongBufferConfig, "DAPO overlong penalty")
    num_workers: int = _f(2, "processes of the parallel reward manager")
    timeout_s: float = _f(10.0, "per-sample scoring time limit (parallel manager / isolated scorers)")
    on_error: str = _f("raise", "a scorer that raises or times out: raise | fallback (score fallback_score, counted)")
    fallback_score: float = _f(0.0, "score used for a failed sample when on_error=fallback")
    num_examine: int = _f(1, "decoded samples printed per data source per step")


@dataclass
class CustomRewardFunctionConfig:
    path: Optional[str] = _f(None, "python file with a custom compute_score function")
    name: str = _f("compute_score", "function name inside path")
    reward_kwargs: dict = _f({}, "keyword arguments passed to the custom function on every call")


# -------------------------------------------------------------------------------------- algorithm
@dataclass
class KLControlConfig:
    type: str = _f("fixed", "KL coefficient controller: fixed | adaptive")
    kl_coef: float = _f(0.001, "initial KL coefficient")
    horizon: int = _f(10000, "adaptive controller horizon")
    target_kl: float = _f(0.1, "adaptive controller target KL")


@dataclass
class FilterGroupsConfig:
    enable: bool = _f(False, "DAPO dynamic sampling: drop groups whose metric is equal across samples")
    metric: str = _f("acc", "what must differ within a group: acc | score")
    max_num_gen_batches: int = _f(10, "max generation batches per step before giving up (0 = unlimited)")


@dataclass
class RolloutCorrectionConfig:
    rollout_is: Optional[str] = _f(None, "truncated importance sampling of the rollout/actor mismatch, ratio level: token | sequence | geometric (None = off)")
    rollout_is_threshold: float = _f(2.0, "cap of the IS weights pi_old / pi_rollout")
    rollout_rs: Optional[str] = _f(None, "rejection (masked IS): drop tokens or sequences whose ratio leaves the band, level: token | sequence | geometric (None = off)")
    rollout_rs_threshold: Optional[float] = _f(None, "upper bound of the rejection band (None = rollout_is_threshold)")
    rollout_rs_threshold_lower: Optional[float] = _f(None, "lower bound of the rejection band (None = 1 / upper)")
    log_prob_diff_threshold: float = _f(0.1, "a token counts as mismatched in training/rollout_log_probs_diff_frac_over when |rollout - actor log-prob| exceeds this")


@dataclass
class AlgorithmConfig:
    adv_estimator: str = _f("grpo", "advantage estimator from the registry: gae | grpo | rloo | reinforce_plus_plus | ...")
    gamma: float = _f(1.0, "discount factor (gae, reinforce_plus_plus)")
    lam: float = _f(1.0, "GAE lambda")
    norm_adv_by_std_in_grpo: bool = _f(True, "divide GRPO/EGPO advantages by the group std (False = Dr.GRPO)")
    singleton_advantage: Optional[str] = _f(None, "advantage of a sample alone in its group: score (baseline 0) | zero | None (verl's per estimator)")
    gpg_alpha_count: str = _f("nonzero_score", "GPG alpha = batch size / M, M = rows with a nonzero_score (verl) | informative rows (the paper)")
    use_kl_in_reward: bool = _f(False, "subtract kl_coef * KL(actor || ref) from the token rewards")
    kl_penalty: str = _f("kl", "KL estimator used in the reward")
    kl_ctrl: KLControlConfig = _sub(KLControlConfig, "KL coefficient controller (use_kl_in_reward)")
    filter_groups: FilterGroupsConfig = _sub(FilterGroupsConfig, "DAPO dynamic sampling")
    rollout_correction: RolloutCorrectionConfig = _sub(RolloutCorrectionConfig, "rollout/actor log-prob mismatch: metrics every step, optional IS weights / rejection")
    egpo_alpha: float = _f(0.5, "EGPO: weight of the confidence term on wrong answers")
    egpo_beta: float = _f(0.1, "EGPO: magnitude of the signal recovered from all-equal groups")
    egpo_correct_threshold: float = _f(0.5, "EGPO: a scalar reward >= this counts as correct")
    egpo_uncertainty_norm: str = _f("group", "EGPO: standardise the entropy proxy within the 'group' or the 'batch'")


# ---------------------------------------------------------------------------------------- trainer
@dataclass
class TrainerConfig:
    project_name: str = _f("rlvr", "project name (loggers, run directory)")
    experiment_name: str = _f("run", "experiment name (loggers, run directory)")
    backend: str = _f("ray", "worker-group backend: ray | local (in-process, for debugging and single device)")
    device: str = _f("auto", "auto | cpu | cuda")
    nnodes: int = _f(1, "nodes in the Ray cluster")
    n_gpus_per_node: int = _f(1, "workers per node (GPUs, or CPU processes when device=cpu)")
    total_epochs: int = _f(1, "passes over the training data")
    total_training_steps: Optional[int] = _f(None, "stop after this many steps (None = epochs x batches)")
    max_time_s: Optional[float] = _f(None, "stop training after this wall time of the training loop (the validation before training is not counted; checkpoint + report still written)")
    critic_warmup: int = _f(0, "steps that train only the critic before the actor starts")
    test_freq: int = _f(-1, "validate every N steps (-1 = only at the end)")
    val_before_train: bool = _f(True, "validate before the first step")
    save_freq: int = _f(-1, "checkpoint every N steps (-1 = only at the end)")
    resume_mode: str = _f("auto", "auto (latest in default_local_dir) | disable | resume_path")
    resume_from_path: Optional[str] = _f(None, "checkpoint directory for resume_mode=resume_path")
    max_actor_ckpt_to_keep: Optional[int] = _f(None, "keep only the last k checkpoints (None = all)")
    default_local_dir: str = _f("runs/${trainer.project_name}/${trainer.experiment_name}", "run directory: checkpoints, metrics, report")
    export_hf: bool = _f(True, "at the end, export the actor to <run dir>/hf_model (loads with from_pretrained)")
    logger: list = _f(["console", "jsonl"], "metric sinks: console | jsonl | tensorboard | wandb")
    log_val_generations: int = _f(8, "sample generations kept in the report table")
    report: bool = _f(True, "write <run dir>/report.md with PNG curves and sample generations at the end")
    seed: int = _f(1, "one seed for init, sampling and data order")
    call_timeout_s: float = _f(3600.0, "time limit of one worker call; a call over it raises naming stage/worker")
    max_restarts: int = _f(3, "Ray backend: restarts after a dead or hung worker (all groups restart, the last whole checkpoint is restored); 0 = stop at the first")
    progress_bar: bool = _f(True, "show a progress bar with ETA")
    num_threads: Optional[int] = _f(None, "torch intra-op threads per worker on CPU (None = cores / workers)")


@dataclass
class RlvrConfig:
    """The whole run."""

    data: DataConfig = _sub(DataConfig, "datasets and batch size")
    actor_rollout_ref: ActorRolloutRefConfig = _sub(ActorRolloutRefConfig, "policy: model, training, reference, rollout")
    critic: CriticConfig = _sub(CriticConfig, "value model (PPO with GAE)")
    reward_model: RewardModelConfig = _sub(RewardModelConfig, "reward manager")
    reward: RewardConfig = _sub(RewardConfig, "reward routing: each domain scored by its reward worker group or manager")
    custom_reward_function: CustomRewardFunctionConfig = _sub(CustomRewardFunctionConfig, "user scoring function")
    algorithm: AlgorithmConfig = _sub(AlgorithmConfig, "advantage estimator and KL")
    trainer: TrainerConfig = _sub(TrainerConfig, "loop, schedule, checkpoints, logging")
