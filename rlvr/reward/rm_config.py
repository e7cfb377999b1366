"""Configuration of verl 0.9's ``reward.*`` sections (reward manager, reward model, custom reward
function, sandbox) and of the legacy ``reward_model.*`` keys of a discriminative reward model.

Dataclasses only (loading a config must not import torch). verl 0.9 keeps the reward model under
``reward.reward_model`` and still maps the older keys (``reward_model.enable``,
``reward_model.model.path``, ...) onto it; :mod:`rlvr.reward.verl_keys` does that mapping for rlvr
when the config loads, so the code reads ``reward.reward_model`` only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from rlvr.utils.config_field import config_field as _f

RM_ENGINE_NAMES = ("hf", "vllm", "sglang")
"""Names accepted for ``reward.reward_model.rollout.name``: rlvr scores a discriminative reward
model with its own frozen-model worker (``hf``); verl's server engines give the same score (the
classifier's output at the last token) and are accepted with a start-up note."""


@dataclass
class ModuleConfig:
    """A class or function in a file of the user's (verl's ``ModuleConfig``)."""

    path: Optional[str] = _f(None, "python file (or module) that defines it")
    name: str = _f("custom_reward_manager", "its name inside path")


@dataclass
class RewardManagerSourceConfig:
    """verl 0.9's ``reward.reward_manager``: which reward manager scores the samples."""

    source: str = _f("register", "register: name is a registered reward manager | importlib: module.path and module.name name a class in your file")
    name: Optional[str] = _f(None, "registered reward manager (naive | dapo | batch | parallel); None = reward_model.reward_manager (the legacy key, default naive)")
    module: ModuleConfig = field(default_factory=ModuleConfig, metadata={"help": "source=importlib: the file and class of the reward manager"})


@dataclass
class RewardCustomFunctionConfig:
    """verl 0.9's ``reward.custom_reward_function`` (the same as the top-level ``custom_reward_function``)."""

    path: Optional[str] = _f(None, "python file with a compute_score function (copied to custom_reward_function.path)")
    name: str = _f("compute_score", "function name inside path")


@dataclass
class SandboxFusionConfig:
    """verl 0.9's ``reward.sandbox_fusion`` (a SandboxFusion service for code rewards)."""

    url: Optional[str] = _f(None, "SandboxFusion URL; rlvr refuses it (its code sandbox speaks another protocol): route code to reward.workers.code_sandbox (local or rlvr.sandbox.http)")
    max_concurrent: int = _f(64, "requests in flight to url (only with url)")
    memory_limit_mb: int = _f(1024, "memory limit of a sandboxed program (only with url)")


@dataclass
class FrozenFSDPConfig:
    """FSDP settings of a frozen model (no optimizer)."""

    param_offload: bool = _f(False, "keep parameters on CPU between phases (GPU only)")
    reshard_after_forward: bool = _f(True, "FSDP2 reshard_after_forward")


@dataclass
class ServingKnobsConfig:
    """verl's vLLM/SGLang serving knobs of a frozen model it serves (a reward model's ``rollout``, a
    teacher's ``inference``). rlvr computes a frozen model's outputs with its frozen-model worker, so
    these are accepted with a note and change nothing (``name`` and ``dtype``: each model's own help)."""

    name: str = _f("hf", "engine: hf (rlvr's frozen-model worker) | vllm | sglang")
    dtype: str = _f("float32", "dtype the model computes in: float32 | bfloat16")
    gpu_memory_utilization: float = _f(0.5, "vLLM serving knob (accepted, no effect on rlvr's worker)")
    enforce_eager: bool = _f(True, "vLLM serving knob (accepted, no effect)")
    cudagraph_capture_sizes: Optional[list] = _f(None, "vLLM serving knob (accepted, no effect)")
    free_cache_engine: bool = _f(True, "vLLM serving knob (accepted, no effect; fsdp_config.param_offload frees GPU memory)")
    data_parallel_size: int = _f(1, "server layout (accepted, no effect: the worker group is data-parallel over its pool)")
    expert_parallel_size: int = _f(1, "server layout (accepted, no effect)")
    tensor_model_parallel_size: int = _f(2, "server layout (accepted, no effect: the worker is FSDP-sharded over its pool)")
    load_format: str = _f("auto", "vLLM serving knob (accepted, no effect: weights load from model_path)")
    enable_chunked_prefill: bool = _f(True, "vLLM serving knob (accepted, no effect)")
    enable_prefix_caching: bool = _f(True, "vLLM serving knob (accepted, no effect)")
    disable_log_stats: bool = _f(True, "vLLM serving knob (accepted, no effect)")


@dataclass
class RMRolloutConfig(ServingKnobsConfig):
    """verl's ``reward.reward_model.rollout``: the inference engine verl serves the reward model
    with. rlvr scores a discriminative reward model with its frozen-model worker; the keys that
    would change the score are honoured or refused, the serving knobs are accepted with a note."""

    name: str = _f("hf", "engine: hf (rlvr's frozen-model worker) | vllm | sglang (accepted, scored by the same worker: the same score)")
    dtype: str = _f("float32", "dtype the reward model computes in: float32 | bfloat16 (verl's default is bfloat16, for GPU memory)")
    pipeline_model_parallel_size: int = _f(1, "server layout (accepted, no effect)")
    max_num_batched_tokens: int = _f(8192, "vLLM serving knob (accepted; rlvr's token budget is forward_max_token_len_per_gpu)")
    max_model_len: Optional[int] = _f(None, "longest reward-model input in tokens (None = prompt_length + response_length); a longer one is refused")
    max_num_seqs: int = _f(1024, "vLLM serving knob (accepted; rlvr's batch is micro_batch_size_per_gpu)")
    layered_summon: bool = _f(False, "vLLM serving knob (accepted, no effect)")
    scheduling_policy: str = _f("fcfs", "vLLM serving knob (accepted, no effect)")
    full_determinism: bool = _f(False, "verl forces one sequence per /classify step; rlvr's worker is deterministic anyway (accepted)")
    seed: int = _f(42, "server seed (accepted, no effect: scoring samples nothing)")
    multi_stage_wake_up: bool = _f(False, "vLLM serving knob (accepted, no effect)")
    engine_kwargs: dict = _f({}, "engine arguments; must stay empty (they would configure a server rlvr does not start)")
    limit_images: Optional[int] = _f(None, "images per input; must stay None (rlvr's reward model scores text)")
    skip_tokenizer_init: bool = _f(False, "must be false: the reward model tokenizes its chat-templated input (verl asserts the same)")
    ignore_eos: bool = _f(False, "sampling setting (accepted, no effect: a reward model does not generate)")
    temperature: float = _f(1.0, "sampling setting (accepted, no effect)")
    top_k: int = _f(-1, "sampling setting (accepted, no effect)")
    top_p: float = _f(1.0, "sampling setting (accepted, no effect)")
    do_sample: bool = _f(True, "sampling setting (accepted, no effect)")
    n: int = _f(1, "sampling setting (accepted, no effect)")
    prompt_length: int = _f(2048, "with response_length: the longest input when max_model_len is None")
    response_length: int = _f(2048, "with prompt_length: the longest input when max_model_len is None")
    quantization: Optional[str] = _f(None, "must stay None: rlvr scores with the weights as stored")
    quantization_config_file: Optional[str] = _f(None, "must stay None (see quantization)")
    mtp: Optional[dict] = _f(None, "multi-token prediction; must stay None (a reward model does not generate)")
    disaggregation: dict = _f({"enabled": False}, "prefill/decode disaggregation; enabled must stay false")


@dataclass
class DiscriminativeRewardModelConfig:
    """verl 0.9's ``reward.reward_model``: a sequence-classification model (``num_labels=1``) whose
    output at the last token of ``prompt + response`` (re-rendered with its own chat template) is
    the reward. rlvr runs it as a frozen-model worker group, colocated with the actor or on its
    own pool, FSDP-sharded and micro-batched like the reference."""

    enable: bool = _f(False, "score responses with the reward model")
    enable_resource_pool: bool = _f(False, "run the reward model on its own pool of nnodes x n_gpus_per_node workers (false: colocated with the actor)")
    n_gpus_per_node: int = _f(8, "workers per node of its own pool (enable_resource_pool)")
    nnodes: int = _f(0, "nodes of its own pool (enable_resource_pool)")
    model_path: Optional[str] = _f(None, "the reward model: a folder or hub id of a *ForSequenceClassification checkpoint with num_labels=1")
    rollout: RMRolloutConfig = field(default_factory=RMRolloutConfig, metadata={"help": "verl's serving settings of the reward model (see each key)"})
    input_tokenizer: Optional[str] = _f(None, "tokenizer that decodes the policy's responses (verl's legacy reward_model.model.input_tokenizer); None = the policy's")
    trust_remote_code: bool = _f(False, "allow custom modelling code from model_path")
    micro_batch_size_per_gpu: int = _f(8, "sequences per reward-model forward on one worker")
    use_dynamic_bsz: bool = _f(False, "size the micro-batches by token budget instead of count")
    forward_max_token_len_per_gpu: int = _f(32768, "token budget of a micro-batch when use_dynamic_bsz (rows x longest row)")
    fsdp_config: FrozenFSDPConfig = field(default_factory=FrozenFSDPConfig, metadata={"help": "FSDP2 and offload settings"})


@dataclass
class LegacyRMModelConfig:
    """verl's legacy ``reward_model.model`` keys (None: not set)."""

    path: Optional[str] = _f(None, "legacy key of reward.reward_model.model_path")
    input_tokenizer: Optional[str] = _f(None, "legacy key of reward.reward_model.input_tokenizer")
    external_lib: Any = _f(None, "a module (or .py file, or list) of your own imported before the reward model is built, like trainer.user_modules")
    trust_remote_code: Optional[bool] = _f(None, "legacy key of reward.reward_model.trust_remote_code")


def rm_max_length(rm: DiscriminativeRewardModelConfig) -> int:
    """The longest reward-model input in tokens of a ``reward.reward_model`` section:
    ``rollout.max_model_len``, else verl's ``prompt_length + response_length`` of its rollout section."""
    rollout = rm.rollout
    if rollout.max_model_len is not None:
        return int(rollout.max_model_len)
    return int(rollout.prompt_length + rollout.response_length)
