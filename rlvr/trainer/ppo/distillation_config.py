"""Configuration of on-policy distillation: verl 0.9's ``distillation`` section (part of the run
schema, :mod:`rlvr.trainer.config.schema`).

A frozen teacher scores the student's own samples (its log-probs on the sampled tokens, or its
top-k next-token distribution at every response position) and the actor adds a distillation loss
(see :mod:`rlvr.trainer.ppo.distillation`). Dataclasses only: loading a config must not import torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from rlvr.reward.rm_config import FrozenFSDPConfig, ServingKnobsConfig
from rlvr.utils.config_field import config_field as _f

ESTIMATOR_LOSS_MODES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
"""Single-sample KL estimators on the sampled tokens (the teacher's log-prob of each sampled token)."""
TOPK_LOSS_MODES = ("forward_kl_topk",)
"""Losses over the teacher's top-k next-token distribution at every response position."""
TEACHER_ENGINE_NAMES = ("hf", "vllm", "sglang")
"""``teacher_models.*.inference.name``: rlvr computes teacher log-probs with its frozen-model worker
(``hf``); verl's server engines compute the same log-probs and are accepted with a start-up note."""


@dataclass
class DistillationLossConfig:
    """verl's ``distillation.distillation_loss``."""

    loss_mode: str = _f("k3", "k1 | kl | abs | k2 | mse | k3 | low_var_kl (KL estimators on the sampled tokens) | forward_kl_topk (forward KL over the teacher's top-k)")
    topk: Optional[int] = _f(32, "forward_kl_topk: teacher tokens kept per position")
    use_task_rewards: bool = _f(True, "add the distillation loss (times distillation_loss_coef) to the policy loss of the task rewards; false: the distillation loss alone")
    distillation_loss_coef: float = _f(1.0, "weight of the distillation loss beside the task rewards' policy loss (1 when use_task_rewards is false)")
    loss_max_clamp: Optional[float] = _f(None, "clamp each token's distillation loss to [-c, c] (None: no clamp)")
    log_prob_min_clamp: Optional[float] = _f(None, "forward_kl_topk: clamp student and teacher top-k log-probs from below (None: no clamp)")
    use_policy_gradient: bool = _f(False, "true: the negative per-token loss is an advantage of a clipped policy-gradient loss (k1 recommended); false: the loss is backpropagated directly")
    policy_loss_mode: str = _f("vanilla", "policy loss of use_policy_gradient (verl supports vanilla only)")
    clip_ratio: float = _f(0.2, "use_policy_gradient: clip epsilon")
    clip_ratio_low: float = _f(0.2, "use_policy_gradient: lower clip epsilon")
    clip_ratio_high: float = _f(0.2, "use_policy_gradient: upper clip epsilon")


@dataclass
class TeacherInferenceConfig(ServingKnobsConfig):
    """verl's ``teacher_models.*.inference``: the engine verl serves the teacher with. rlvr computes
    the teacher's log-probs with its frozen-model worker; serving knobs are accepted with a note."""

    name: str = _f("hf", "engine: hf (rlvr's frozen-model worker) | vllm | sglang (accepted, computed by the same worker)")
    dtype: str = _f("float32", "dtype the teacher computes in: float32 | bfloat16")
    max_num_batched_tokens: int = _f(8192, "vLLM serving knob (accepted; rlvr's token budget is max_token_len_per_gpu)")
    max_model_len: Optional[int] = _f(None, "must hold prompt + response + 1 tokens when set (verl checks the same)")
    max_num_seqs: int = _f(1024, "vLLM serving knob (accepted, no effect)")
    engine_kwargs: dict = _f({}, "engine arguments; vllm.max_logprobs must be >= topk when set, other entries must stay empty")
    limit_images: Optional[int] = _f(None, "images per input; must stay None (rlvr's teacher scores text)")
    skip_tokenizer_init: bool = _f(True, "the teacher reads token ids (accepted)")
    prompt_length: int = _f("${actor_rollout_ref.rollout.prompt_length}", "the student's prompt length (set from data.max_prompt_length)")
    response_length: int = _f("${actor_rollout_ref.rollout.response_length}", "the student's response length (set from data.max_response_length)")
    temperature: float = _f(1.0, "accepted, no effect: teacher log-probs are always of the untempered distribution (as verl)")


@dataclass
class TeacherModelConfig:
    """One teacher (verl's ``distillation.teacher_models.<entry>``)."""

    key: Optional[str] = _f(None, "value of distillation.teacher_key routed to this teacher (several teachers only)")
    model_path: Optional[str] = _f(None, "the teacher: folder, GGUF file, hub id or 'smollm2-135m-instruct'; any size, but the student's tokenizer")
    num_replicas: Optional[int] = _f(0, "server replicas in verl; rlvr runs one worker group per teacher over its pool (accepted)")
    inference: TeacherInferenceConfig = field(default_factory=TeacherInferenceConfig, metadata={"help": "verl's serving settings of the teacher"})
    trust_remote_code: bool = _f(False, "allow custom modelling code from model_path")
    log_prob_micro_batch_size_per_gpu: int = _f(16, "sequences per teacher forward on one worker")
    use_dynamic_bsz: bool = _f(False, "size the teacher's micro-batches by token budget instead of count")
    max_token_len_per_gpu: int = _f(16384, "token budget of a teacher micro-batch when use_dynamic_bsz")
    fsdp_config: FrozenFSDPConfig = field(default_factory=FrozenFSDPConfig, metadata={"help": "FSDP2 and offload settings"})


@dataclass
class DistillationConfig:
    """verl's ``distillation`` section: on-policy distillation from a frozen teacher."""

    enabled: bool = _f(False, "distil a frozen teacher into the policy on the policy's own samples")
    n_gpus_per_node: int = _f(8, "workers per node of the teacher's own pool (nnodes > 0)")
    nnodes: int = _f(0, "nodes of the teacher's own pool; 0: the teacher is colocated with the actor (verl always gives it a pool)")
    teacher_models: dict[str, TeacherModelConfig] = field(default_factory=lambda: {"teacher_model": TeacherModelConfig()}, metadata={"help": "the teacher (one entry, teacher_model)"})
    teacher_key: str = _f("data_source", "non-tensor field that routes a sample to a teacher (several teachers only)")
    distillation_loss: DistillationLossConfig = field(default_factory=DistillationLossConfig, metadata={"help": "loss mode, top-k, weights and clamps"})


def teacher_config(cfg: Any) -> Any:
    """The one teacher's section of a run config (``distillation.teacher_models.teacher_model``)."""
    return cfg.distillation.teacher_models["teacher_model"]
