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

from rlvr.reward.config import CustomRewardFunctionConfig, RewardConfig, RewardModelConfig
from rlvr.trainer.config.schema_sections import (
    CheckpointConfig,
    CheckpointEngineConfig,
    CustomClassConfig,
    EngineKwargsConfig,
    RayKwargsConfig,
)
from rlvr.trainer.ppo.distillation_config import DistillationConfig
from rlvr.utils.config_field import config_field as _f
from rlvr.utils.profiler.config import GlobalProfilerConfig, ProfilerConfig, RolloutProfilerConfig
from rlvr.workers.moe import REPLAY_MODES


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
    val_max_samples: Optional[int] = _f(None, "use only the first N validation prompts (None or -1 = all)")
    train_max_samples: Optional[int] = _f(None, "train on a random subset (seeded by data.seed) of N prompts (None or -1 = all)")
    shuffle: bool = _f(True, "shuffle the training data every epoch (seeded by data.seed)")
    seed: Optional[int] = _f(None, "seed of the data order (None = trainer.seed)")
    filter_overlong_prompts: bool = _f(True, "drop prompts longer than max_prompt_length (count is logged)")
    truncation: str = _f("error", "if a prompt is still too long: error | left | right")
    apply_chat_template: bool = _f(True, "render the prompt messages with the tokenizer's chat template")
    image_key: str = _f("images", "column of each row's images, one per <image> placeholder in its prompt")
    output_path: Optional[str] = _f(None, "main_generation_server: the parquet file written (the rows of train_files with a responses column)")
    video_key: str = _f("videos", "column of videos: rlvr trains on text and images, so a row with videos is refused when the data loads")
    audio_key: str = _f("audios", "column of audio: rlvr trains on text and images, so a row with audio is refused when the data loads")
    return_raw_chat: bool = _f(True, "keep each prompt's chat messages in the batch (raw_prompt: the agent loops need them); False drops them once the prompt is tokenized")
    trust_remote_code: bool = _f(False, "allow custom code of the tokenizer / processor that tokenizes the data")
    custom_cls: CustomClassConfig = _sub(CustomClassConfig, "your own dataset class instead of rlvr's RLHFDataset")
    filter_overlong_prompts_workers: int = _f(1, "processes that measure the prompts' lengths for filter_overlong_prompts (the same prompts are kept)")
    apply_chat_template_kwargs: dict = _f({}, "keyword arguments of the tokenizer's apply_chat_template (e.g. enable_thinking: false)")
    mm_processor_kwargs: dict = _f({}, "keyword arguments of the processor's call on a row with images (e.g. max_pixels)")
    reward_fn_key: str = _f("data_source", "column that names each row's data source for the reward manager's compute_score")


# ---------------------------------------------------------------------------------- model / optim
@dataclass
class MegatronLoraConfig:
    """verl's ``model.lora``: LoRA adapters of a strategy=megatron actor (rlvr.workers.megatron.lora).
    The FSDP engines' LoRA is ``model.lora_rank`` / ``lora_alpha`` / ``target_modules`` (peft)."""

    rank: int = _f(0, "LoRA rank of the Megatron actor's adapters; 0 = no adapters (the actor only: strategy=megatron)")
    alpha: float = _f(32, "the adapters' output is scaled by alpha / rank")
    type: str = _f("lora", "lora (one adapter on each fused layer: linear_qkv, linear_fc1) | canonical_lora (one on each of q, k, v, gate, up, as peft places them)")
    dropout: float = _f(0.0, "dropout probability on the adapters (training only)")
    dropout_position: str = _f("pre", "where the dropout is: pre (the adapter's input) | post (its output)")
    target_modules: list = _f(["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"], "adapted Megatron layers: linear_qkv, linear_proj, linear_fc1, linear_fc2 (type=canonical_lora: linear_q, linear_k, linear_v, linear_proj, linear_fc1_gate, linear_fc1_up, linear_fc2), or globs of full names such as '*.layers.0.*.linear_qkv' (the layer index in the whole model)")
    exclude_modules: list = _f([], "with target_modules=[]: every layer of the type except these")
    lora_A_init_method: str = _f("xavier", "initial A: xavier (normal) | kaiming (uniform) | normal (std 0.2) | zero")
    lora_B_init_method: str = _f("zero", "initial B: the same choices; zero starts from the base model exactly")
    dtype: Optional[str] = _f(None, "dtype of the adapters' parameters: float32 | bfloat16 | float16 (None = the model's)")


@dataclass
class ModelConfig:
    path: str = _f("smollm2-135m-instruct", "hub id, local directory, .gguf file or 'smollm2-135m-instruct' (embedded)")
    tokenizer_path: Optional[str] = _f(None, "tokenizer location if different from path")
    dtype: str = _f("float32", "parameter dtype for training: float32 | bfloat16")
    attn_implementation: Optional[str] = _f(None, "transformers attention kernel: sdpa | eager | flash_attention_2 (None = default)")
    enable_gradient_checkpointing: bool = _f(False, "recompute activations in backward to save memory")
    use_remove_padding: bool = _f(False, "pack each micro-batch's sequences into one row: no compute on padding, attention kept within each sequence (exact)")
    trust_remote_code: bool = _f(False, "allow custom modelling code from the model directory")
    lora_rank: int = _f(0, "LoRA rank; 0 trains all weights")
    lora_alpha: int = _f(16, "LoRA scaling alpha")
    lora_dropout: float = _f(0.0, "LoRA dropout")
    target_modules: Any = _f("all-linear", "LoRA target modules: 'all-linear' or a list of module names")
    use_fused_kernels: bool = _f(True, "log-probs and entropy from the last hidden states through rlvr's fused linear head (a chunk of tokens at a time: the micro-batch's full logits never exist; one rank, a bias-free LM head); false: from the full logits")
    custom_chat_template: Optional[str] = _f(None, "a Jinja chat template that replaces the tokenizer's (data, rollout and agent loops)")
    exclude_modules: Any = _f(None, "LoRA: module names (or a regex) left without adapters")
    override_config: dict = _f({}, "values that replace the model config's own (e.g. attention_dropout: 0.0), given to from_pretrained; an MoE model's {output_router_logits: true, router_aux_loss_coef: 0.01} puts its routers' load-balancing loss into the actor's loss")
    external_lib: Any = _f(None, "verl's key: a module (or .py file, or a list) of your own imported before the model is built; rlvr imports it like trainer.user_modules")
    lora: MegatronLoraConfig = _sub(MegatronLoraConfig, "verl's Megatron LoRA section (strategy=megatron actor; the FSDP engines use lora_rank)")


@dataclass
class OptimConfig:
    lr: float = _f(1e-6, "peak learning rate of AdamW")
    betas: list = _f([0.9, 0.999], "AdamW betas")
    eps: float = _f(1e-8, "AdamW epsilon")
    weight_decay: float = _f(0.01, "AdamW weight decay")
    warmup_steps: int = _f(0, "linear warmup steps (takes precedence over warmup_steps_ratio when > 0)")
    warmup_steps_ratio: float = _f(0.0, "warmup as a fraction of the total training steps")
    lr_scheduler_type: Optional[str] = _f("constant", "learning-rate schedule after warmup: constant | cosine (None = constant)")
    min_lr_ratio: Optional[float] = _f(0.0, "cosine schedule floor as a fraction of lr (None = 0)")
    num_cycles: float = _f(0.5, "waves of the cosine schedule over the decay (0.5: one half cosine, lr down to the floor)")
    zero_indexed_step: Optional[bool] = _f(None, "verl's step counting of the schedule: True = from 0 (the first warmup step has lr 0), False = from 1; None = rlvr's (warmup from lr / warmup_steps, decay from the end of the warmup)")
    lr_decay_style: Optional[str] = _f(None, "Megatron's schedule after warmup (replaces lr_scheduler_type when set): constant | linear | cosine | inverse-square-root | WSD")
    min_lr: float = _f(0.0, "lr_decay_style: the lr at the end of the decay")
    lr_decay_steps: Optional[int] = _f(None, "lr_decay_style: steps from the start to the end of the decay (None = total_training_steps)")
    lr_warmup_init: float = _f(0.0, "lr_decay_style: the lr the warmup starts from")
    lr_wsd_decay_style: str = _f("exponential", "lr_decay_style=WSD: shape of the final decay: linear | cosine | exponential | minus_sqrt")
    lr_wsd_decay_steps: Optional[int] = _f(None, "lr_decay_style=WSD: steps of the final decay (the lr stays at lr before it)")
    clip_grad: Optional[float] = _f(None, "max global gradient norm (verl's name; None = the role's grad_clip)")
    optimizer: str = _f("AdamW", "optimizer class in optimizer_impl (AdamW, Adam, ...; Megatron's adam = AdamW)")
    optimizer_impl: str = _f("torch.optim", "module of the optimizer class (torch.optim, or a package of yours)")
    override_optimizer_config: Optional[dict] = _f(None, "more keyword arguments of the optimizer class")
    total_training_steps: int = _f(-1, "set by the trainer from the data; used by the schedule")


@dataclass
class RouterReplayConfig:
    """verl's ``router_replay`` section of an engine config: a mixture-of-experts actor replays routes
    (see :mod:`rlvr.workers.moe.actor_routing`); read from the actor's own backend section."""

    mode: str = field(default="disabled", metadata={"help": "MoE routing replay: disabled | R2 (the update uses the experts of the actor's compute_log_prob) | R3 (compute_log_prob and the update use the rollout's experts; needs rollout.enable_rollout_routing_replay)", "choices": REPLAY_MODES})
    record_file: Optional[str] = _f(None, "verl defines it but never reads it; rlvr keeps the routes in the batch (routed_experts): null only")
    replay_file: Optional[str] = _f(None, "verl defines it but never reads it; rlvr keeps the routes in the batch (routed_experts): null only")


@dataclass
class RefFSDPConfig:
    """The frozen reference's FSDP settings: it has no optimizer, so no ``optimizer_offload``."""

    param_offload: bool = _f(False, "keep parameters on CPU between phases (GPU only)")
    reshard_after_forward: bool = _f(True, "FSDP2 reshard_after_forward")
    router_replay: RouterReplayConfig = _sub(RouterReplayConfig, "MoE routing replay of the actor (strategy fsdp/fsdp2); disabled elsewhere")
    model_dtype: Optional[str] = _f(None, "dtype the model's parameters are loaded and kept in: fp32 | bf16 (None = model.dtype)")
    dtype: Optional[str] = _f(None, "mixed precision: compute in this dtype, keep parameters in model_dtype (bf16 | fp32; None = no mixed precision)")
    offload_policy: bool = _f(False, "FSDP2's CPUOffloadPolicy: sharded parameters, gradients and optimizer state live on CPU (several ranks)")
    forward_prefetch: bool = _f(False, "FSDP2: all-gather the next decoder layer while the current one computes (several ranks)")
    seed: Optional[int] = _f(None, "seed of this role's randomly initialised parts (LoRA, value head); None = trainer.seed")
    full_determinism: bool = _f(False, "deterministic torch kernels for this role (torch.use_deterministic_algorithms; slower)")


@dataclass
class FSDPConfig(RefFSDPConfig):
    """A trained model's FSDP settings: the reference's and its optimizer's offload."""

    optimizer_offload: bool = _f(False, "keep optimizer state on CPU between phases (GPU only)")


@dataclass
class RefMegatronConfig:
    """A frozen model's Megatron-LM settings (``strategy=megatron``; verl's keys). Roles that share a
    process (actor, reference, critic) share one layout: unset sizes follow the actor's."""

    tensor_model_parallel_size: Optional[int] = _f(None, "ranks that split every weight matrix (must divide the key/value heads); None = 1 for the actor, the actor's for reference and critic")
    pipeline_model_parallel_size: Optional[int] = _f(None, "ranks that split the layers into stages (must divide the layers); None = 1 for the actor, the actor's for reference and critic")
    expert_model_parallel_size: Optional[int] = _f(None, "MoE: ranks that split the experts of every MoE layer (must divide the experts); None = 1 for the actor, the actor's for reference and critic")
    expert_tensor_parallel_size: Optional[int] = _f(None, "MoE: ranks that split every expert's weight matrices (None = tensor_model_parallel_size, as in verl)")
    context_parallel_size: Optional[int] = _f(None, "ranks that split every sequence (context parallelism: each holds 2 of 2 x cp chunks, attention over the all-gathered keys); None = 1 for the actor, the actor's for reference and critic")
    param_offload: bool = _f(False, "keep parameters on CPU between phases (GPU only)")
    router_replay: RouterReplayConfig = _sub(RouterReplayConfig, "MoE routing replay of the actor (strategy megatron); disabled elsewhere")
    override_transformer_config: dict = _f({}, "megatron-core TransformerConfig fields (recompute_granularity, recompute_method, recompute_num_layers, recompute_modules, ...)")
    seed: Optional[int] = _f(None, "seed of the model's random init (and Megatron's RNG tracker); None = trainer.seed")
    dtype: Optional[str] = _f(None, "mixed precision: compute in this dtype, keep parameters in model.dtype (bf16 | fp32; None = no mixed precision)")
    use_dist_checkpointing: bool = _f(False, "start this role from a Megatron distributed checkpoint (dist_checkpointing_path) instead of model.path's weights (model.path still gives the config and tokenizer)")
    dist_checkpointing_path: Optional[str] = _f(None, "the Megatron distributed checkpoint folder (megatron.core.dist_checkpointing, e.g. verl's HF -> mcore converter's output)")
    dist_checkpointing_prefix: str = _f("", "the prefix of the parameter names in that checkpoint")


@dataclass
class MegatronConfig(RefMegatronConfig):
    """A trained model's Megatron-LM settings: the frozen model's and its optimizer's offload."""

    optimizer_offload: bool = _f(False, "keep optimizer state on CPU between phases (GPU only)")


# ------------------------------------------------------------------------------------------ actor
@dataclass
class PolicyLossConfig:
    """The loss-specific knobs of the registered policy losses; the clip ratios they share are
    fields of the actor section (a loss is called with ``config`` = the whole actor section)."""

    loss_mode: str = _f("vanilla", "policy loss from the registry: vanilla | gspo | gpg | cispo | clip_cov | kl_cov | geo_mean | dppo_tv | dppo_kl | sapo | dro, or pkg.module:fn")
    clip_cov_ratio: float = _f(0.0002, "clip_cov: fraction of valid tokens whose gradient is cut (> 0)")
    clip_cov_lb: float = _f(1.0, "clip_cov: lower covariance bound of the candidate tokens")
    clip_cov_ub: float = _f(5.0, "clip_cov: upper covariance bound of the candidate tokens")
    kl_cov_ratio: float = _f(0.0002, "kl_cov: fraction of valid tokens that get the |log-ratio| penalty (> 0)")
    ppo_kl_coef: float = _f(0.1, "kl_cov: coefficient of the per-token |log-ratio| penalty")
    dro_beta: Optional[float] = _f(None, "dro: coefficient of the quadratic log-ratio penalty 0.5 * beta * (log pi - log pi_old)^2 (required, > 0)")


STRATEGIES = ("fsdp", "fsdp2", "megatron")
"""Training backends: ``fsdp``/``fsdp2`` run PyTorch FSDP2 over the worker group, ``megatron`` runs
megatron-core with tensor/pipeline parallelism (``rlvr[megatron]``, see docs/megatron.md)."""

AGG_LOSS_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
"""The loss aggregation modes of ``agg_loss`` (``actor.loss_agg_mode``, ``critic.loss_agg_mode``)."""

SINGLETON_CHOICES = ("score", "zero")
# vLLM load formats that read the model folder's weight files (verl's scripts name safetensors; auto picks
# safetensors, else PyTorch .bin): the engine's first weights are the checkpoint's, not random (`dummy`)
WEIGHT_FILE_FORMATS = ("auto", "safetensors", "pt")
"""What a group estimator gives a prompt's only sample (``algorithm.singleton_advantage``)."""

GPG_ALPHA_COUNTS = ("nonzero_score", "informative")
"""How GPG counts the samples of its alpha correction (``algorithm.gpg_alpha_count``)."""


@dataclass
class ActorConfig:
    strategy: str = _f("fsdp2", "training backend: fsdp | fsdp2 (PyTorch FSDP2 over the worker group) | megatron (megatron-core tensor/pipeline parallel)")
    ppo_mini_batch_size: int = _f(8, "prompts per optimizer step (times rollout.n sequences); must divide data.train_batch_size, as in verl 0.9.1")
    ppo_micro_batch_size_per_gpu: Optional[int] = _f(8, "sequences per forward/backward on one worker (gradient accumulation); None = the worker's whole mini-batch at once")
    ppo_micro_batch_size: Optional[int] = _f(None, "verl's older global micro-batch: when set, ppo_micro_batch_size_per_gpu = it / the data-parallel workers")
    use_dynamic_bsz: bool = _f(False, "size micro-batches by token budget instead of sequence count")
    ppo_max_token_len_per_gpu: int = _f(16384, "token budget of a micro-batch when use_dynamic_bsz (real tokens with use_remove_padding, rows x longest row without)")
    ulysses_sequence_parallel_size: int = _f(1, "Ulysses sequence parallelism: ranks that split each packed sequence (needs model.use_remove_padding; heads must split over it)")
    ppo_epochs: int = _f(1, "passes over each batch")
    shuffle: bool = _f(False, "shuffle sequences between mini-batches")
    grad_clip: float = _f(1.0, "max global gradient norm; a step with a non-finite norm is skipped")
    clip_ratio: float = _f(0.2, "clip epsilon of every loss that clips (default for low and high)")
    clip_ratio_low: Optional[float] = _f(None, "lower clip epsilon (None = clip_ratio); gspo: sequence ratio, cispo: IS weight, geo_mean: log-ratio")
    clip_ratio_high: Optional[float] = _f(None, "upper clip epsilon (None = clip_ratio; DAPO uses 0.28, GSPO 4e-4)")
    clip_ratio_c: float = _f(3.0, "dual-clip lower bound for negative advantages (> 1)")
    loss_agg_mode: str = _f("token-mean", "token-mean | token-sum | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm")
    entropy_coeff: float = _f(0.0, "entropy bonus coefficient")
    tau_pos: float = _f(1.0, "sapo: temperature of the soft gate on tokens with a positive advantage (> 0)")
    tau_neg: float = _f(1.05, "sapo: temperature of the soft gate on tokens with a non-positive advantage (> 0)")
    calculate_sum_pi_squared: bool = _f(False, "also compute sum_v pi(v)^2 per response token in the old-log-prob pass (needed by optimal_token_baseline)")
    use_kl_loss: bool = _f(False, "add a KL(actor || ref) term to the loss (GRPO style); needs the reference")
    kl_loss_coef: float = _f(0.001, "coefficient of the KL loss")
    kl_loss_type: str = _f("low_var_kl", "KL estimator of the loss: kl | abs | mse | low_var_kl (k1 | k2 | k3, '+' = k2 gradient)")
    policy_loss: PolicyLossConfig = _sub(PolicyLossConfig, "policy-loss registry settings")
    global_batch_info: dict = _f({}, "set by the worker, not by users: agg_loss's dp_size/batch_num_tokens/global_batch_size ({} = per micro-batch)")
    optim: OptimConfig = _sub(OptimConfig, "optimizer and schedule")
    fsdp_config: FSDPConfig = _sub(FSDPConfig, "FSDP2 and offload settings")
    megatron: MegatronConfig = _sub(MegatronConfig, "strategy=megatron: tensor/pipeline parallel sizes and offload")
    use_torch_compile: bool = _f(False, "torch.compile the model forward of the actor (and reference) passes; a model that does not compile runs eagerly, with a warning (verl's default is true; rlvr's false: compiling costs more than it saves in short runs, docs/PERFORMANCE.md)")
    use_fused_kernels: bool = _f("${oc.select:actor_rollout_ref.model.use_fused_kernels,true}", "the actor's log-probs and entropy through the fused linear head (default: model.use_fused_kernels; true in an actor section built alone)")
    calculate_entropy: bool = _f(False, "compute the policy's entropy in the update even when entropy_coeff is 0 (the actor/entropy metric)")
    entropy_from_logits_with_chunking: bool = _f(False, "compute the entropy in chunks of entropy_from_logits_chunk_size rows (memory; the same values)")
    entropy_from_logits_chunk_size: int = _f(2048, "rows (tokens) per chunk of the chunked entropy")
    freeze_vision_tower: bool = _f(False, "vision-language models: the vision encoder does not train")
    loss_scale_factor: Optional[float] = _f(None, "seq-mean-token-sum-norm: the constant each sequence's token sum is divided by (None = the response length)")
    data_loader_seed: Optional[int] = _f(None, "seed of the shuffle between mini-batches (shuffle=true); None = trainer.seed")
    checkpoint: CheckpointConfig = _sub(CheckpointConfig, "what the actor's checkpoints hold")
    share_prompt_forward: bool = _f(True, "on one rank, run each distinct prompt of a micro-batch once and its responses on its KV cache (exact; about n times less prompt compute)")
    use_rollout_log_probs: bool = _f(True, "reuse the rollout's exact sampling log-probs as old_log_probs when they match the actor (skips a forward pass)")
    profiler: ProfilerConfig = _sub(ProfilerConfig, "profile the actor's stages (old_log_prob, update_actor) in global_profiler.steps")


@dataclass
class RefConfig:
    strategy: Optional[str] = _f(None, "training backend of a separate reference: fsdp | fsdp2 | megatron (None = the actor's)")
    log_prob_micro_batch_size_per_gpu: Optional[int] = _f(16, "sequences per forward when computing reference log-probs (None = the worker's whole batch)")
    log_prob_micro_batch_size: Optional[int] = _f(None, "verl's older global micro-batch: when set, log_prob_micro_batch_size_per_gpu = it / the workers")
    use_torch_compile: bool = _f("${actor_rollout_ref.actor.use_torch_compile}", "torch.compile the reference's forward (default: the actor's)")
    log_prob_use_dynamic_bsz: bool = _f("${actor_rollout_ref.actor.use_dynamic_bsz}", "size the reference log-prob micro-batches by token budget (default: the actor's use_dynamic_bsz)")
    log_prob_max_token_len_per_gpu: int = _f("${actor_rollout_ref.actor.ppo_max_token_len_per_gpu}", "token budget of a reference log-prob micro-batch (default: the actor's ppo_max_token_len_per_gpu)")
    ulysses_sequence_parallel_size: int = _f("${actor_rollout_ref.actor.ulysses_sequence_parallel_size}", "Ulysses sequence-parallel ranks of the reference (default: the actor's)")
    fsdp_config: RefFSDPConfig = _sub(RefFSDPConfig, "FSDP2 and offload settings")
    megatron: RefMegatronConfig = _sub(RefMegatronConfig, "strategy=megatron: parallel sizes and offload")
    profiler: ProfilerConfig = _sub(ProfilerConfig, "profile the reference's stage (ref) in global_profiler.steps")


@dataclass
class SamplingConfig:
    temperature: float = _f(0.0, "validation sampling temperature (0 = greedy)")
    top_p: float = _f(1.0, "validation nucleus sampling")
    top_k: int = _f(-1, "validation top-k (-1 = off)")
    do_sample: bool = _f(False, "sample during validation (False = greedy)")
    n: int = _f(1, "samples per validation prompt")


@dataclass
class OpenAIEndpointConfig:
    run: Optional[str] = _f(None, "openai_agent: the agent, a function run(client, row) -> answer: 'package.module:function' or 'path/to/file.py:function'")
    host: str = _f("127.0.0.1", "address of rlvr's OpenAI-compatible endpoint; anything but loopback needs api_key")
    port: int = _f(0, "port of the endpoint (0 = a free port)")
    api_key: Optional[str] = _f(None, "key the endpoint requires (Authorization: Bearer); required off loopback")
    max_request_bytes: int = _f(1 << 20, "larger request bodies are refused (HTTP 413)")
    max_concurrent_runs: int = _f(64, "agent functions running at once (one per sample)")
    run_timeout_s: float = _f(600.0, "time limit of one sample's agent function; later requests of that sample are refused")


@dataclass
class AgentConfig:
    default_agent_loop: str = _f("single_turn", "agent loop (registry) for rows without an agent_name field: single_turn | tool_agent | env_agent | openai_agent")
    openai: OpenAIEndpointConfig = _sub(OpenAIEndpointConfig, "openai_agent: an agent written against the OpenAI API, served by rlvr's /v1/chat/completions")


@dataclass
class MultiTurnConfig:
    max_assistant_turns: Optional[int] = _f(4, "most model turns in one multi-turn rollout (tool_agent, env_agent); None = until the response budget ends")
    max_user_turns: Optional[int] = _f(None, "most inserted turns (tool results, environment replies) in one rollout; None = no limit")
    tool_response_truncate_side: str = _f("right", "where a tool result or reply longer than max_tool_response_tokens is cut: left (keep its end) | middle | right (keep its start)")
    max_tool_response_tokens: int = _f(256, "an inserted tool result or environment reply is cut to this many tokens")
    tool_config_path: Optional[str] = _f(None, "YAML file of the tools of tool_agent (see rlvr.agent.tools)")
    format: str = _f("hermes", "tool-call parser (registry): hermes = <tool_call>{json}</tool_call>")
    stop_after_tool_call: bool = _f(True, "end a model turn right after a complete tool call (the parser's stop strings)")
    max_parallel_calls: int = _f(1, "tool calls run per model turn; further calls in the turn get an error message")
    tool_timeout_s: float = _f(30.0, "time limit of one turn's tool calls (all samples together); a late call becomes an error message")
    env_name: Optional[str] = _f(None, "environment (registry) of the env_agent loop, e.g. retry")
    env_kwargs: dict = _f({}, "keyword arguments of the environment's constructor")


@dataclass
class ServerConfig:
    urls: list = _f([], "servers you run yourself (http://host:port, vLLM with VLLM_SERVER_DEV_MODE=1 and --enable-scale-out); empty = rlvr starts num_replicas")
    num_replicas: int = _f(1, "managed replicas rlvr starts (each a vLLM OpenAI server subprocess)")
    host: str = _f("127.0.0.1", "loopback address the managed replicas bind to (dev mode: never another address, see docs/rollout.md)")
    port: int = _f(0, "port of managed replica 0, replica i gets port + i (0 = free ports)")
    api_key: Optional[str] = _f(None, "key the managed replicas require (vLLM --api-key) and rlvr sends to every replica")
    cpu_binds: list = _f([], "CPU cores of each managed replica's OpenMP threads (VLLM_CPU_OMP_THREADS_BIND, e.g. ['1'] or ['0-1']); empty = all cores of this process, shared")
    cuda_devices: list = _f([], "CUDA_VISIBLE_DEVICES of each managed replica (e.g. ['0', '1']); empty = inherited")
    python: Optional[str] = _f(None, "Python that runs vLLM for managed replicas, e.g. .venv-vllm/bin/python (None = this one)")
    kv_cache_space_gb: int = _f(2, "CPU KV cache of each managed replica in whole GiB (VLLM_CPU_KVCACHE_SPACE)")
    extra_args: list = _f([], "more arguments of every managed replica's server command line")
    weights_dir: Optional[str] = _f(None, "folder the trainer writes the HF weights to after each update, read by every replica at this path (None = a temporary folder; required with urls)")
    log_dir: Optional[str] = _f(None, "folder of the managed replicas' log files (None = a new temporary folder, kept)")
    startup_timeout_s: float = _f(600.0, "time limit for a managed replica to answer its health check")
    request_timeout_s: float = _f(600.0, "time limit of one generate request; then it is retried on another replica")
    sync_timeout_s: float = _f(120.0, "time limit of each call of the weight sync (pause, reload, reset cache, version, resume)")
    max_retries: int = _f(2, "a request that fails (timeout, dead replica) is sent again to another replica up to this many times")
    max_restarts: int = _f(3, "restarts of each managed replica that died (it gets the current weights before it serves)")
    max_concurrent_requests: int = _f(64, "HTTP requests in flight from this engine (all replicas)")


@dataclass
class RolloutConfig:
    name: str = _f("hf", "rollout engine from the registry: hf (transformers) | vllm (vLLM; `make setup-vllm`)")
    mode: str = _f("sync", "vllm: sync (vLLM's LLM inside the worker's process) | async (vLLM OpenAI server replicas, see rollout.server; verl's server mode)")
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
    log_prob_micro_batch_size_per_gpu: Optional[int] = _f(16, "sequences per forward for compute_log_prob (None = the worker's whole batch)")
    log_prob_micro_batch_size: Optional[int] = _f(None, "verl's older global micro-batch: when set, log_prob_micro_batch_size_per_gpu = it / the workers")
    log_prob_use_dynamic_bsz: bool = _f("${actor_rollout_ref.actor.use_dynamic_bsz}", "size the compute_log_prob micro-batches by token budget (default: the actor's use_dynamic_bsz)")
    log_prob_max_token_len_per_gpu: int = _f("${actor_rollout_ref.actor.ppo_max_token_len_per_gpu}", "token budget of a compute_log_prob micro-batch (default: the actor's ppo_max_token_len_per_gpu)")
    static_cache: bool = _f(False, "use a static KV cache (GPU fast path)")
    compile: bool = _f(False, "torch.compile the decode step (GPU fast path, with static_cache)")
    free_cache_engine: bool = _f(True, "free the rollout's KV cache after generation (vllm: sleep between phases, GPU only)")
    quantization: Optional[str] = _f(None, "rollout weights: fp8 (hf: e4m3 linear layers, per-channel scales, re-quantised at every weight sync; vllm: its quantization='fp8') | null = off")
    val_kwargs: SamplingConfig = _sub(SamplingConfig, "sampling settings for validation")
    dtype: Optional[str] = _f(None, "dtype of the engine's weights: float32 | bfloat16 (None = the actor's; the HF engine keeps its own copy in another dtype)")
    gpu_memory_utilization: float = _f(0.5, "vllm: share of GPU memory for weights and KV cache (the actor lives beside it)")
    tensor_model_parallel_size: int = _f(1, "vllm: ranks per engine; mode=sync: that many consecutive rollout workers hold one in-process engine (1: an engine on every worker); mode=async: each server replica's --tensor-parallel-size")
    data_parallel_size: int = _f(1, "vllm, mode=sync: engines per replica of tensor x data parallel workers (a dense model's vLLM data parallelism: independent engines); mode=async: 1 (replicas are server.num_replicas)")
    pipeline_model_parallel_size: int = _f(1, "verl's key; 1 only: rlvr's rollout engines split the model by tensor parallelism")
    expert_parallel_size: int = _f(1, "vllm, MoE: 1 splits the experts like the other weights (tensor parallel); > 1 places whole experts on the ranks of a server replica (rollout.mode=async; must equal tensor_model_parallel_size)")
    enable_rollout_routing_replay: bool = _f(False, "MoE: the engine returns the experts every token went to (routed_experts), for router_replay.mode=R3 and rollout/moe metrics (hf engine, single_turn agent loop)")
    moe_load_balance_metrics_interval: int = _f(0, "MoE: every this many steps log rollout/moe/* expert-load metrics from the rollout's routed_experts (needs enable_rollout_routing_replay; 0 = off)")
    enforce_eager: bool = _f(True, "vllm: no CUDA graphs / compilation (fast start; False compiles for speed)")
    enable_prefix_caching: bool = _f(True, "vllm: reuse the KV cache of shared prompt prefixes (the n samples of a prompt)")
    enable_sleep_mode: bool = _f(True, "vllm: free weights and KV cache between phases on GPU (sleep/wake_up); no-op on CPU")
    max_num_batched_tokens: Optional[int] = _f(None, "vllm: token budget of one engine step (None = vLLM's default)")
    max_num_seqs: int = _f(256, "vllm: most sequences decoded together")
    calculate_log_probs: bool = _f(True, "return the sampled tokens' log-probs (rollout_log_probs): the mismatch metrics, the rollout correction, bypass_mode and reusing them as old log-probs need them")
    seed: Optional[int] = _f(None, "seed of the rollout's sampling (worker i samples with seed + i); None = from trainer.seed")
    full_determinism: bool = _f(False, "deterministic kernels in the rollout workers (torch.use_deterministic_algorithms; slower)")
    enable_chunked_prefill: Optional[bool] = _f(None, "vllm: split long prefills into chunks scheduled with decodes (None = vLLM's default)")
    max_model_len: Optional[int] = _f(None, "vllm: the engine's longest sequence (None = prompt_length + response_length)")
    disable_log_stats: bool = _f(True, "vllm: no periodic engine statistics in the log")
    cudagraph_capture_sizes: Optional[list] = _f(None, "vllm (CUDA, enforce_eager=false): batch sizes to capture CUDA graphs for (None = vLLM's)")
    scheduling_policy: str = _f("fcfs", "vllm: request scheduling: fcfs | priority")
    engine_kwargs: EngineKwargsConfig = _sub(EngineKwargsConfig, "more arguments of the inference engine")
    checkpoint_engine: CheckpointEngineConfig = _sub(CheckpointEngineConfig, "how new weights reach the rollout")
    load_format: str = _f("dummy", "vllm: the engine's first weights: dummy (random; the actor's are loaded in place before the first generation) | auto, safetensors, pt (read from the model folder, in vLLM's named file format)")
    kv_cache_memory_bytes: Optional[int] = _f(None, "vllm: KV-cache size in bytes (None = gpu_memory_utilization on GPU, 1 GiB on CPU)")
    block_size: Optional[int] = _f(None, "vllm: KV-cache block in tokens (None = 32 on CPU, where the default 128 outgrows short prompts; vLLM's default on GPU)")
    agent: AgentConfig = _sub(AgentConfig, "agent loops above the engine (single-turn, tools, environments)")
    multi_turn: MultiTurnConfig = _sub(MultiTurnConfig, "limits, tools and environment of multi-turn agent loops")
    server: ServerConfig = _sub(ServerConfig, "rollout.mode=async: the inference server replicas (managed or rollout.server.urls)")
    profiler: RolloutProfilerConfig = _sub(RolloutProfilerConfig, "profile generation (gen) in global_profiler.steps; defaults follow the actor's profiler")


@dataclass
class ActorRolloutRefConfig:
    nccl_timeout: Optional[float] = _f(None, "seconds a collective of the actor / rollout / reference process group may take (None = trainer.call_timeout_s)")
    hybrid_engine: bool = _f(True, "actor, rollout and reference share one worker group; false: the rollout runs in a resource pool of its own (top-level rollout section; the local backend: a child process)")
    model: ModelConfig = _sub(ModelConfig, "the policy model")
    actor: ActorConfig = _sub(ActorConfig, "policy training")
    ref: RefConfig = _sub(RefConfig, "reference policy")
    rollout: RolloutConfig = _sub(RolloutConfig, "generation")


# ----------------------------------------------------------------------------------------- critic
@dataclass
class CriticModelConfig(ModelConfig):
    path: Optional[str] = _f(None, "critic model location (LM with a scalar value head); None = the actor's model.path")
    tokenizer_path: Optional[str] = _f(None, "critic's tokenizer; it reads the policy's token ids, so it must have the policy's vocabulary (None = the policy's tokenizer)")
    use_fused_kernels: bool = _f(False, "verl's key: the critic computes values, not log-probs, so it has no fused head (false only)")


@dataclass
class CriticConfig:
    enable: Optional[bool] = _f(None, "use a critic (None = when the estimator's registry entry needs one, e.g. gae)")
    strategy: str = _f("fsdp2", "training backend: fsdp | fsdp2 (PyTorch FSDP2 over the worker group) | megatron (megatron-core tensor/pipeline parallel)")
    model: CriticModelConfig = _sub(CriticModelConfig, "critic model; unset fields follow the actor's model")
    optim: OptimConfig = _sub(OptimConfig, "critic optimizer")
    ppo_mini_batch_size: int = _f(8, "prompts per critic optimizer step")
    ppo_micro_batch_size_per_gpu: Optional[int] = _f(8, "sequences per critic forward/backward (None = the worker's whole mini-batch)")
    ppo_micro_batch_size: Optional[int] = _f(None, "verl's older global micro-batch: when set, ppo_micro_batch_size_per_gpu = it / the workers")
    forward_micro_batch_size_per_gpu: Optional[int] = _f("${critic.ppo_micro_batch_size_per_gpu}", "sequences per compute_values forward (default: ppo_micro_batch_size_per_gpu)")
    forward_micro_batch_size: Optional[int] = _f(None, "verl's older global micro-batch of compute_values (divided by the workers)")
    shuffle: bool = _f("${actor_rollout_ref.actor.shuffle}", "shuffle sequences between the critic's mini-batches (default: the actor's)")
    data_loader_seed: Optional[int] = _f(None, "seed of the critic's mini-batch shuffle; None = trainer.seed")
    loss_scale_factor: Optional[float] = _f(None, "seq-mean-token-sum-norm: the constant each sequence's token sum is divided by (None = the response length)")
    checkpoint: CheckpointConfig = _sub(CheckpointConfig, "what the critic's checkpoints hold")
    nccl_timeout: Optional[float] = _f(None, "seconds a collective of the critic's process group may take (None = trainer.call_timeout_s)")
    use_dynamic_bsz: bool = _f(False, "size the critic's micro-batches by token budget instead of sequence count")
    ppo_max_token_len_per_gpu: int = _f(32768, "token budget of a critic update micro-batch when use_dynamic_bsz")
    forward_max_token_len_per_gpu: int = _f("${critic.ppo_max_token_len_per_gpu}", "token budget of a compute_values micro-batch when use_dynamic_bsz (default: ppo_max_token_len_per_gpu)")
    ulysses_sequence_parallel_size: int = _f(1, "Ulysses sequence-parallel ranks of the critic (needs critic.model.use_remove_padding)")
    ppo_epochs: int = _f(1, "critic passes over each batch")
    cliprange_value: float = _f(0.5, "value clipping range")
    grad_clip: float = _f(1.0, "max gradient norm of the critic")
    loss_agg_mode: str = _f("token-mean", "aggregation of the value loss (see actor.loss_agg_mode)")
    fsdp_config: FSDPConfig = _sub(FSDPConfig, "FSDP2 and offload settings")
    megatron: MegatronConfig = _sub(MegatronConfig, "strategy=megatron: tensor/pipeline parallel sizes and offload")
    profiler: ProfilerConfig = _sub(ProfilerConfig, "profile the critic's stages (values, update_critic) in global_profiler.steps")


# ----------------------------------------------------------------------------------------- reward
# OverlongBufferConfig, RewardModelConfig and CustomRewardFunctionConfig live in rlvr.reward.config
# (the reward managers read them without importing the trainer).


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
    metric: str = _f("acc", "what must differ within a group: acc | score (verl's reward / seq_reward: the score)")
    max_num_gen_batches: int = _f(10, "max generation batches per step before giving up (0 = unlimited)")


@dataclass
class RolloutCorrectionConfig:
    rollout_is: Optional[str] = _f(None, "truncated importance sampling of the rollout/actor mismatch, ratio level: token | sequence | geometric (None = off)")
    rollout_is_threshold: Any = _f(2.0, "cap of the IS weights pi_old / pi_rollout: a number (or number string), or 'lower_upper' (IcePop: weights outside [lower, upper] are zeroed)")
    rollout_rs: Optional[str] = _f(None, "rejection (masked IS): drop tokens or sequences whose ratio leaves the band, level: token | sequence | geometric (None = off)")
    rollout_rs_threshold: Any = _f(None, "upper bound of the rejection band, or 'lower_upper' (None = rollout_is_threshold)")
    rollout_rs_threshold_lower: Optional[float] = _f(None, "lower bound of the rejection band (None = 1 / upper)")
    loss_type: str = _f("ppo_clip", "bypass_mode: ppo_clip (the PPO ratio pi_theta / pi_rollout, clipped) | reinforce (no clipping: the policy gradient weighted by the truncated IS weight)")
    rollout_is_batch_normalize: bool = _f(False, "divide the IS weights by their batch mean (over valid tokens, or sequences for sequence-level weights) so they average 1")
    bypass_mode: bool = _f(False, "use the rollout's log-probs as old_log_probs (no actor forward); the PPO ratio then corrects the whole rollout/actor gap")
    log_prob_diff_threshold: float = _f(0.1, "a token counts as mismatched in training/rollout_log_probs_diff_frac_over when |rollout - actor log-prob| exceeds this")


@dataclass
class AlgorithmConfig:
    adv_estimator: str = _f("grpo", "advantage estimator from the registry: gae | grpo | rloo | reinforce_plus_plus | ..., or pkg.module:fn")
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
    gdpo_reward_keys: Optional[list] = _f(None, "GDPO: the reward function's extra-info keys (its compute_score dict) normalised one by one within each group")
    gdpo_reward_weights: Optional[list] = _f(None, "GDPO: weight of each gdpo_reward_keys entry in the sum (None = all 1)")


# ------------------------------------------------------------------------- rollout apart, async
@dataclass
class RolloutPoolConfig:
    """verl's top-level ``rollout`` section (one-step-off and fully-async recipes): the resource pool
    of the rollout workers when they run apart from the actor."""

    nnodes: int = _f(1, "nodes of the rollout's resource pool (actor_rollout_ref.hybrid_engine=false)")
    n_gpus_per_node: int = _f(1, "rollout workers per node (GPUs, or CPU processes; the local backend runs 1, in a child process)")


ASYNC_MODES = ("sync", "one_step", "bounded")
STALENESS_POLICIES = ("wait", "drop")


@dataclass
class AsyncTrainingConfig:
    """The schedule of generation and training (verl's ``async_training`` section; the version bound
    is AReaL's ``max_head_offpolicyness``, TRL's ``max_staleness``)."""

    mode: str = _f("sync", "sync: generate, then train | one_step: generate batch k+1 while training batch k | bounded: the rollout streams, each sample at most max_staleness versions old (one_step and bounded need actor_rollout_ref.hybrid_engine=false)")
    max_staleness: int = _f(1, "bounded: most weight versions a sample may lag behind the policy that trains on it (0 = synchronous; one_step is 1)")
    staleness_policy: str = _f("wait", "bounded: wait (the rollout starts no sample that could exceed the bound) | drop (a sample over the bound is dropped and its prompt generated again)")
    partial_rollout: bool = _f(False, "bounded: a weight update interrupts the running generations, which go on with the new weights (earlier tokens keep their log-probs and versions); needs an interruptible engine (hf)")
    trigger_parameter_sync_step: int = _f(1, "push the weights to the rollout every k actor updates (wait: k <= max_staleness + 1)")
    compute_prox_log_prob: Optional[bool] = _f(None, "decoupled PPO: the actor recomputes the proximal (old) log-probs and algorithm.rollout_correction weighs the behaviour/proximal ratio (token TIS if unset); false: the engine's log-probs are the old ones; None = on when samples can be stale")
    prox_log_prob_from_update: Optional[bool] = _f(None, "decoupled PPO with one optimizer step per batch: the proximal log-probs are the update's own forward pass (detached), the same policy, so the actor's separate log-prob pass is skipped; None = whenever that is exact (ppo_epochs 1, one mini-batch, an FSDP actor, no rollout_rs, no KL in the reward, an estimator that does not read old_log_prob); false: always recompute")
    lend_idle_cores: bool = _f(False, "local backend on a CPU, rollout apart (hybrid_engine=false): while the trainer waits for samples the rollout uses all the cores, and while the rollout waits the trainer does (re-checked every decode step and actor forward); faster, but float rounding then depends on timing, so a run is not bit-for-bit repeatable; needs trainer.num_threads unset")
    queue_timeout_s: float = _f(3600.0, "longest wait of the trainer for generated samples before it raises naming the stage and the rollout worker group")
    weight_sync_timeout_s: float = _f(600.0, "time limit of one weight push to the rollout workers (a hung push raises naming the worker)")


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
    max_actor_ckpt_to_keep: Optional[int] = _f(None, "keep the actor's state in the last k checkpoints only (None = all)")
    max_critic_ckpt_to_keep: Optional[int] = _f(None, "keep the critic's state in the last k checkpoints only (None = all)")
    default_local_dir: str = _f("runs/${trainer.project_name}/${trainer.experiment_name}", "run directory: checkpoints, metrics, report")
    export_hf: bool = _f(True, "at the end, export the actor to <run dir>/hf_model (loads with from_pretrained)")
    logger: list = _f(["console", "jsonl"], "metric sinks: console | jsonl | tensorboard | wandb")
    log_val_generations: int = _f(8, "validation samples logged to every logger as a table (W&B table val/generations, TensorBoard text, val_generations.jsonl, console) and kept for the report (0 = none)")
    rollout_data_dir: Optional[str] = _f(None, "write every training step's samples to <dir>/<step>.jsonl: input, output, gts, score, step and the reward's extra info (None = off)")
    validation_data_dir: Optional[str] = _f(None, "write every validation's samples to <dir>/<step>.jsonl, fields as rollout_data_dir plus reward (None = off)")
    val_only: bool = _f(False, "validate once (at step 0, or the resumed checkpoint's step) and stop: no training, checkpoint or export; needs validation data")
    report: bool = _f(True, "write <run dir>/report.md with PNG curves and sample generations at the end")
    seed: int = _f(1, "one seed for init, sampling and data order")
    call_timeout_s: float = _f(3600.0, "time limit of one worker call; a call over it raises naming stage/worker")
    max_restarts: int = _f(3, "Ray backend: restarts after a dead or hung worker (all groups restart, the last whole checkpoint is restored); 0 = stop at the first")
    progress_bar: bool = _f(True, "show a progress bar with ETA")
    num_threads: Optional[int] = _f(None, "torch intra-op threads per worker on CPU (None = cores / workers)")
    balance_batch: bool = _f(True, "before the old log-probs, reorder the batch so that every data-parallel rank gets about the same tokens; rows move only within their mini-batch (the update is unchanged), a prompt's group stays whole when the estimator needs groups")
    user_modules: list = _f([], "your own modules (names or .py files) imported by the driver before the config check and by every worker process before it builds anything; their registrations are then valid names")


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
    rollout: RolloutPoolConfig = _sub(RolloutPoolConfig, "resource pool of a rollout that runs apart from the actor")
    async_training: AsyncTrainingConfig = _sub(AsyncTrainingConfig, "overlap of generation and training: schedule, staleness bound, partial rollouts")
    trainer: TrainerConfig = _sub(TrainerConfig, "loop, schedule, checkpoints, logging")
    ray_kwargs: RayKwargsConfig = _sub(RayKwargsConfig, "Ray start-up settings")
    model_engine: str = _f("dp", "verl's training-engine selector (model_engine=NAME picks the strategies): dp (FSDP2) | megatron | veomni / torchtitan (FSDP2-based engines: rlvr runs its FSDP2, with a start-up note)")
    distillation: DistillationConfig = _sub(DistillationConfig, "on-policy distillation from a frozen teacher (verl 0.9's keys)")
    global_profiler: GlobalProfilerConfig = _sub(GlobalProfilerConfig, "profiling: the tool (torch | torch_memory), the steps, where traces go")
