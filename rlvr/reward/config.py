"""Configuration of the reward side of a run: the routing section ``reward`` and every reward
worker's config.

Dataclasses only, on purpose: the run schema (:mod:`rlvr.trainer.config.schema`) includes these
sections, and loading a config must not import torch. A field with a fixed set of values is a
``str`` whose metadata lists its ``choices`` (OmegaConf 2.3, the one Hydra 1.3 and verl install,
has no ``Literal`` fields): the config check refuses any other value, naming the key and the
choices, and each worker validates its own values again when it is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from rlvr.reward.rm_config import (
    DiscriminativeRewardModelConfig,
    LegacyRMModelConfig,
    RewardCustomFunctionConfig,
    RewardManagerSourceConfig,
    SandboxFusionConfig,
)
from rlvr.sandbox.config import SandboxConfig

DEFAULT_JUDGE_TEMPLATE = (
    "You are a strict grader. Compare the candidate answer with the reference answer and rate how "
    "correct and complete it is on a scale from 0 to 10.\n\n"
    "Question:\n{question}\n\nReference answer:\n{reference}\n\nCandidate answer:\n{response}\n\n"
    'Reply with a short justification followed by the rating in the form "Score: X/10".'
)
ROUTE_KEYS = ("data_source", "tag")


# ------------------------------------------------------------------------------- reward workers
@dataclass
class RewardWorkerConfig:
    """Fields every reward worker has."""

    tokenizer_path: str | None = field(default=None, metadata={"help": "tokenizer that decodes responses (model alias, folder, GGUF or hub id); None: the policy's tokenizer in a training run, the embedded default model standalone"})


@dataclass
class MathRuleRewardConfig(RewardWorkerConfig):
    """Config of :class:`~rlvr.reward.workers.math_rule.MathRuleRewardWorker`."""

    timeout_s: float = field(default=5.0, metadata={"help": "math-verify time limit per sample (parsing and comparison)"})
    timeout_score: float = field(default=0.0, metadata={"help": "reward of a sample whose check ran past timeout_s (counted in reward/math/timeout)"})


@dataclass
class CodeSandboxRewardConfig(RewardWorkerConfig):
    """Config of :class:`~rlvr.reward.workers.code_sandbox.CodeSandboxRewardWorker`."""

    sandbox: SandboxConfig = field(default_factory=SandboxConfig, metadata={"help": "limits and isolation of the local sandbox (also the concurrency of runs)"})
    sandbox_url: str | None = field(default=None, metadata={"help": "URL of an HTTP sandbox service (rlvr.sandbox.http protocol); None runs locally"})
    request_timeout_s: float = field(default=60.0, metadata={"help": "HTTP timeout per request to sandbox_url"})
    partial_credit: bool = field(default=False, metadata={"help": "reward = fraction of passed test runs instead of 1.0 only when all pass"})
    allow_raw_code: bool = field(default=False, metadata={"help": "treat a response without a fenced code block as code (else it scores 0)"})


@dataclass
class JudgeServerConfig:
    """A vLLM OpenAI server replica that rlvr starts for the judge (``judge_server.enable``)."""

    enable: bool = field(default=False, metadata={"help": "serve judge_model_path with a vLLM OpenAI server subprocess that each judge worker starts and stops (instead of a local transformers model)"})
    python: Optional[str] = field(default=None, metadata={"help": "Python that runs vLLM, e.g. .venv-vllm/bin/python (None = this one)"})
    host: str = field(default="127.0.0.1", metadata={"help": "address the server binds to (loopback; another address needs judge_api_key_env)"})
    port: int = field(default=0, metadata={"help": "its port (0 = a free port)"})
    dtype: str = field(default="auto", metadata={"help": "vLLM --dtype of the judge's weights"})
    max_model_len: int = field(default=4096, metadata={"help": "vLLM --max-model-len: judge prompt + completion"})
    kv_cache_space_gb: int = field(default=1, metadata={"help": "CPU KV cache in whole GiB (VLLM_CPU_KVCACHE_SPACE); GPU: vLLM's default share"})
    cpu_bind: Optional[str] = field(default=None, metadata={"help": "CPU cores of the server's threads (VLLM_CPU_OMP_THREADS_BIND, e.g. '0-1'); None = all cores of this process"})
    startup_timeout_s: float = field(default=600.0, metadata={"help": "time limit for the server to answer its health check"})
    log_dir: Optional[str] = field(default=None, metadata={"help": "folder of the server's log (None = a new temporary folder, kept)"})
    extra_args: list = field(default_factory=list, metadata={"help": "more arguments of the server's command line"})


@dataclass
class LLMJudgeRewardConfig(RewardWorkerConfig):
    """Config of :class:`~rlvr.reward.workers.llm_judge.LLMJudgeRewardWorker`."""

    judge_model_path: str = field(default="smollm2-135m-instruct", metadata={"help": "local judge model (alias, folder, GGUF or hub id); unused with judge_api_base"})
    judge_api_base: str | None = field(default=None, metadata={"help": "OpenAI-compatible API root (e.g. http://127.0.0.1:8000/v1); None uses the local model (or the server of judge_server)"})
    judge_api_model: str = field(default="judge", metadata={"help": "model name sent to judge_api_base (the served name of judge_server)"})
    judge_api_key_env: str = field(default="", metadata={"help": "environment variable with the API key for judge_api_base (empty: none)"})
    judge_server: JudgeServerConfig = field(default_factory=JudgeServerConfig, metadata={"help": "a vLLM server replica of judge_model_path that rlvr starts"})
    request_timeout_s: float = field(default=60.0, metadata={"help": "HTTP timeout per judge request"})
    max_retries: int = field(default=3, metadata={"help": "a judge request that times out, cannot connect or gets 5xx/408/429 is sent again up to this many times"})
    retry_backoff_s: float = field(default=1.0, metadata={"help": "wait before the first retry, doubled for each next one (at most 30 s)"})
    max_concurrency: int = field(default=8, metadata={"help": "judge HTTP requests in flight at once (per judge worker)"})
    prompt_template: str = field(default=DEFAULT_JUDGE_TEMPLATE, metadata={"help": "judge prompt with {question}, {response} and {reference} placeholders"})
    prompt_fn: Optional[str] = field(default=None, metadata={"help": "your own prompt builder instead of prompt_template: 'pkg.module:fn' or 'file.py:fn', fn(question, response, reference) -> str"})
    score_parser: Optional[str] = field(default=None, metadata={"help": "your own verdict parser: 'pkg.module:fn' or 'file.py:fn', fn(text, scale_max) -> float in [0, 1] or None (None = rlvr.reward.scorers.judge.parse_judge_score)"})
    max_new_tokens: int = field(default=128, metadata={"help": "judge completion length"})
    batch_size: int = field(default=8, metadata={"help": "prompts per generate call of the local judge"})
    scale_max: float = field(default=10.0, metadata={"help": "top of the judge's scale for bare numbers (e.g. [[8]] -> 0.8)"})
    fallback_score: float | None = field(default=None, metadata={"help": "reward when the verdict cannot be parsed; None: 0.0 and the sample counts as not applicable"})


@dataclass
class GeneralValRuleRewardConfig(RewardWorkerConfig):
    """Config of :class:`~rlvr.reward.workers.qa_rule.GeneralValRuleRewardWorker`."""

    match_mode: str = field(default="exact", metadata={"help": "exact: normalised answer equals a reference; contains: a normalised reference also counts when it appears as whole words in the answer", "choices": ("exact", "contains")})


@dataclass
class CrossThinkQARuleRewardConfig(RewardWorkerConfig):
    """Config of :class:`~rlvr.reward.workers.qa_rule.CrossThinkQARuleRewardWorker`."""

    reward_type: str = field(default="soft", metadata={"help": "strict | soft | loose, see CrossThinkQARuleRewardWorker", "choices": ("strict", "soft", "loose")})


@dataclass
class MultipleChoiceBoxedRuleRewardConfig(RewardWorkerConfig):
    """Config of :class:`~rlvr.reward.workers.qa_rule.MultipleChoiceBoxedRuleRewardWorker`."""

    format_error_reward: float = field(default=0.0, metadata={"help": "reward when the answer has no \\boxed{} option letter"})


@dataclass
class GeneralRuleRewardConfig(RewardWorkerConfig):
    """Config of :class:`~rlvr.reward.workers.ifeval_rule.GeneralRuleRewardWorker` (IFEval)."""

    reward_mode: str = field(default="fraction", metadata={"help": "fraction: share of instructions followed; all: 1.0 only when every instruction is followed", "choices": ("fraction", "all")})
    loose: bool = field(default=False, metadata={"help": "reward from the loose checks (first/last line and '*' tolerated) instead of the strict ones"})


@dataclass
class DetectionRewardConfig(RewardWorkerConfig):
    """Config of :class:`~rlvr.reward.workers.detection.DetectionRewardWorker`."""

    accuracy_metric: str = field(default="map", metadata={"help": "map: COCO mAP@[.5:.95]; map50: AP@.5; f1: greedy IoU matching at iou_threshold", "choices": ("map", "map50", "f1")})
    format_weight: float = field(default=0.2, metadata={"help": "weight of the format score (answer parses into well-formed boxes)"})
    accuracy_weight: float = field(default=0.8, metadata={"help": "weight of the accuracy score"})
    iou_threshold: float = field(default=0.5, metadata={"help": "IoU for a match in the f1 metric"})


# --------------------------------------------------------- the reward manager (verl's sections)
ON_ERROR_CHOICES = ("raise", "fallback", "fallback_timeouts")
"""``reward_model.on_error``: what a sample whose scorer raised or timed out gets (rlvr.reward.managers.base)."""

@dataclass
class OverlongBufferConfig:
    """DAPO's overlong-buffer length penalty (``reward_model.overlong_buffer``)."""

    enable: bool = field(default=False, metadata={"help": "DAPO overlong-buffer length penalty"})
    len: int = field(default=0, metadata={"help": "length of the buffer before max_resp_len where the penalty ramps up"})
    penalty_factor: float = field(default=1.0, metadata={"help": "penalty at max_resp_len"})
    log: bool = field(default=False, metadata={"help": "log the penalty per sample"})


@dataclass
class RewardModelConfig:
    """The reward manager of a run without routes (``reward_model``)."""

    reward_manager: Optional[str] = field(default="naive", metadata={"help": "reward manager from the registry: naive | dapo | batch | parallel, or pkg.module:Class (null, verl's unset legacy key: reward.reward_manager.name, else naive)"})
    reward_kwargs: dict = field(default_factory=dict, metadata={"help": "extra keyword arguments for the reward manager"})
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig, metadata={"help": "DAPO overlong penalty"})
    num_workers: Optional[int] = field(default=2, metadata={"help": "processes of the parallel reward manager (null, verl's unset legacy key: 2)"})
    timeout_s: float = field(default=10.0, metadata={"help": "per-sample scoring time limit (parallel manager / isolated scorers)"})
    on_error: str | None = field(default=None, metadata={"help": "a scorer that raises or times out: raise | fallback (score fallback_score, counted) | fallback_timeouts (timeouts only, as verl); null: the manager's default (naive/dapo: fallback_timeouts, others: raise)"})
    fallback_score: float = field(default=0.0, metadata={"help": "score used for a failed sample that falls back (on_error)"})
    num_examine: int = field(default=1, metadata={"help": "decoded samples printed per data source per step"})
    # verl's legacy reward-model keys (None: not set); mapped onto reward.reward_model when the config loads
    enable: Optional[bool] = field(default=None, metadata={"help": "legacy key of reward.reward_model.enable"})
    enable_resource_pool: Optional[bool] = field(default=None, metadata={"help": "legacy key of reward.reward_model.enable_resource_pool"})
    n_gpus_per_node: Optional[int] = field(default=None, metadata={"help": "legacy key of reward.reward_model.n_gpus_per_node"})
    nnodes: Optional[int] = field(default=None, metadata={"help": "legacy key of reward.reward_model.nnodes"})
    model: LegacyRMModelConfig = field(default_factory=LegacyRMModelConfig, metadata={"help": "legacy reward-model keys: path, input_tokenizer, external_lib, trust_remote_code"})
    rollout: dict = field(default_factory=dict, metadata={"help": "legacy keys of reward.reward_model.rollout (each copied there)"})
    micro_batch_size_per_gpu: Optional[int] = field(default=None, metadata={"help": "legacy key of reward.reward_model.micro_batch_size_per_gpu"})
    max_length: Optional[int] = field(default=None, metadata={"help": "legacy key of reward.reward_model.rollout.max_model_len: the longest reward-model input"})
    use_dynamic_bsz: Optional[bool] = field(default=None, metadata={"help": "legacy key of reward.reward_model.use_dynamic_bsz"})
    forward_max_token_len_per_gpu: Optional[int] = field(default=None, metadata={"help": "legacy key of reward.reward_model.forward_max_token_len_per_gpu"})
    reward_loop_source: Optional[str] = field(default=None, metadata={"help": "legacy key of reward.reward_manager.source"})
    reward_loop_module_path: Optional[str] = field(default=None, metadata={"help": "legacy key of reward.reward_manager.module.path"})
    reward_loop_class_name: Optional[str] = field(default=None, metadata={"help": "legacy key of reward.reward_manager.module.name"})


@dataclass
class CustomRewardFunctionConfig:
    """A scoring function in a file of the user's (``custom_reward_function``)."""

    path: str | None = field(default=None, metadata={"help": "python file with a custom compute_score function (a module already imported from it, e.g. by trainer.user_modules, is reused)"})
    name: str | None = field(default="compute_score", metadata={"help": "function name inside path (None = compute_score)"})
    reward_kwargs: dict = field(default_factory=dict, metadata={"help": "keyword arguments passed to the custom function on every call"})


@dataclass
class RewardDataKeys:
    """The key of the ``data`` section that a reward manager reads."""

    reward_fn_key: str = field(default="data_source", metadata={"help": "column that names each row's data source for compute_score"})


@dataclass
class RewardManagerSections:
    """The sections of the run config that building a reward manager reads (verl's layout)."""

    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    custom_reward_function: CustomRewardFunctionConfig = field(default_factory=CustomRewardFunctionConfig)
    data: RewardDataKeys = field(default_factory=RewardDataKeys)


# ------------------------------------------------------------------------------- the run's section
@dataclass
class RewardWorkersConfig:
    """One section per built-in reward worker; the section's name is the worker's route name."""

    math_rule: MathRuleRewardConfig = field(default_factory=MathRuleRewardConfig, metadata={"help": "math answers checked with math-verify (\\boxed{})"})
    code_sandbox: CodeSandboxRewardConfig = field(default_factory=CodeSandboxRewardConfig, metadata={"help": "generated code run against the sample's tests in the sandbox"})
    llm_judge: LLMJudgeRewardConfig = field(default_factory=LLMJudgeRewardConfig, metadata={"help": "another LLM grades the response"})
    general_val: GeneralValRuleRewardConfig = field(default_factory=GeneralValRuleRewardConfig, metadata={"help": "general QA answer matching"})
    crossthinkqa: CrossThinkQARuleRewardConfig = field(default_factory=CrossThinkQARuleRewardConfig, metadata={"help": "CrossThink-QA multiple choice"})
    mc_boxed: MultipleChoiceBoxedRuleRewardConfig = field(default_factory=MultipleChoiceBoxedRuleRewardConfig, metadata={"help": "multiple choice answered in \\boxed{}"})
    ifeval: GeneralRuleRewardConfig = field(default_factory=GeneralRuleRewardConfig, metadata={"help": "IFEval instruction following"})
    detection: DetectionRewardConfig = field(default_factory=DetectionRewardConfig, metadata={"help": "box detection answers scored by IoU and COCO mAP"})


@dataclass
class RewardConfig:
    """Which reward source scores which domain (the RLVR pipeline's reward routing)."""

    route_key: str = field(default="data_source", metadata={"help": "non-tensor field that names a sample's domain: data_source | tag", "choices": ("data_source", "tag")})
    routes: dict[str, str] = field(default_factory=dict, metadata={"help": "domain -> reward worker (math_rule | code_sandbox | llm_judge | general_val | crossthinkqa | mc_boxed | ifeval | detection, each its own worker group) or reward manager (naive | dapo | batch | parallel, on the driver); empty: reward_model.reward_manager scores every sample"})
    num_workers: int = field(default=1, metadata={"help": "processes per reward worker group on the Ray backend (each scores its share of a domain's samples); the local backend runs 1 in the driver"})
    workers: RewardWorkersConfig = field(default_factory=RewardWorkersConfig, metadata={"help": "settings of each reward worker"})
    reward_manager: RewardManagerSourceConfig = field(default_factory=RewardManagerSourceConfig, metadata={"help": "verl 0.9's reward manager keys (copied to reward_model.reward_manager when the config loads)"})
    reward_model: DiscriminativeRewardModelConfig = field(default_factory=DiscriminativeRewardModelConfig, metadata={"help": "a discriminative reward model (sequence classification): alone, or routed as 'reward_model' in reward.routes"})
    custom_reward_function: RewardCustomFunctionConfig = field(default_factory=RewardCustomFunctionConfig, metadata={"help": "verl 0.9's key of the top-level custom_reward_function (copied there when the config loads)"})
    sandbox_fusion: SandboxFusionConfig = field(default_factory=SandboxFusionConfig, metadata={"help": "verl 0.9's SandboxFusion service (refused when set; see url)"})
