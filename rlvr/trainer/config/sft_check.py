"""Load and check the SFT trainer's config (:mod:`rlvr.trainer.config.sft_schema`), torch-free.

Overrides are parsed by Hydra's own override grammar, and a user YAML may be composed on the
defaults with ``--config-path`` / ``--config-name`` (:mod:`rlvr.trainer.config.structured`). verl's
config-group selections (``engine=fsdp``, ``optim=fsdp``, ``model=hf_model``, ``profiler=profiler``)
pick the only groups rlvr's SFT trainer has; another group is refused with the reason.

:func:`check_sft_config` then sorts every verl key into what rlvr honours, what it refuses with the
reason when set (a :class:`~rlvr.utils.errors.ConfigError` naming the key), and pure speed switches
accepted with a one-line note (returned, printed at start-up).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from rlvr.trainer.config.sft_schema import TURBO_DEFAULTS, SFTConfig
from rlvr.trainer.config.structured import load_structured_config
from rlvr.trainer.config.suggest import did_you_mean
from rlvr.utils.errors import ConfigError

__all__ = ["load_sft_config", "check_sft_config", "sft_world_size", "SFT_GROUPS"]

SFT_GROUPS = {"engine": "fsdp", "optim": "fsdp", "model": "hf_model", "profiler": "profiler"}
"""verl's config groups of ``sft_trainer_engine.yaml`` and the one option of each that rlvr runs."""
BACKENDS = ("auto", "local", "process", "ray")
DEVICES = ("auto", "cpu", "cuda")
LOGGERS = ("console", "jsonl", "tensorboard", "wandb")
DTYPES = {"fp32": "float32", "float32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16"}
"""``engine.model_dtype`` / ``engine.dtype`` names (verl's and torch's) -> rlvr's ``model.dtype``."""


def load_sft_config(overrides: Sequence[str] = (), config_file: str | Path | None = None) -> DictConfig:
    """The SFT config: schema defaults, then a user YAML, then the overrides (Hydra's grammar; see
    :func:`~rlvr.trainer.config.structured.load_structured_config`).

    Raises:
        ConfigError: an unknown key (with a suggestion), a value of the wrong type, an unparsable
            override, or a config group rlvr does not have.
    """
    cfg = load_structured_config(SFTConfig, overrides, config_file, tool="SFT trainer (PyTorch FSDP2)",
                                 groups=SFT_GROUPS, base_names=("sft_trainer_engine",))
    if isinstance(cfg.trainer.logger, str):  # verl's trainer.logger=console
        cfg.trainer.logger = [cfg.trainer.logger]
    return cfg


def sft_world_size(cfg: DictConfig, launched_ranks: int | None) -> int:
    """Ranks of the run: torchrun's processes, else ``nnodes x n_gpus_per_node``."""
    return launched_ranks if launched_ranks is not None else cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node


def _require(condition: bool, key: str, message: str) -> None:
    if not condition:
        raise ConfigError(key, message)


def _refused(cfg: DictConfig) -> None:
    """verl keys whose setting rlvr cannot honour: refused, each with what to do."""
    m, e, o, d, t = cfg.model, cfg.engine, cfg.optim, cfg.data, cfg.trainer
    rules = [
        (m.hf_config_path is None, "model.hf_config_path", "rlvr builds the model from the config in model.path; "
         "save the model with the config you want and point model.path at it"),
        (not m.override_config, "model.override_config", "changing the model's config at load is not available; save "
         "the model with the changed config and point model.path at it"),
        (not m.enable_activation_offload, "model.enable_activation_offload", "rlvr has no activation offload; use "
         "model.enable_gradient_checkpointing to save activation memory"),
        (m.exclude_modules is None, "model.exclude_modules", "list the LoRA targets in model.target_modules instead"),
        (m.lora_adapter_path is None, "model.lora_adapter_path", "starting from an adapter is not available; merge it "
         "into the model first (peft's merge_and_unload) and fine-tune that"),
        (not m.mtp.get("enable", False), "model.mtp.enable", "multi-token prediction is not available in rlvr"),
        (int(m.lora.get("rank", 0)) == 0, "model.lora.rank", "this is Megatron's LoRA section; the FSDP2 trainer's "
         "LoRA is model.lora_rank / lora_alpha / target_modules"),
        (e.strategy in ("fsdp", "fsdp2"), "engine.strategy", f"{e.strategy!r}: rlvr's SFT trainer runs fsdp | fsdp2"),
        (not e.offload_policy, "engine.offload_policy", "use engine.param_offload / optimizer_offload (GPU)"),
        (e.fsdp_size == -1, "engine.fsdp_size", "HSDP groups are not available; rlvr shards over all ranks (-1)"),
        (not e.full_determinism, "engine.full_determinism", "rlvr does not switch on deterministic CUDA kernels; "
         "CPU runs are repeatable bit for bit"),
        (not e.forward_only, "engine.forward_only", "the SFT trainer trains; set it to false"),
        (e.model_dtype in DTYPES, "engine.model_dtype", f"{e.model_dtype!r}: use fp32 or bf16"),
        (e.dtype is None or DTYPES.get(e.dtype) == DTYPES.get(e.model_dtype), "engine.dtype",
         f"{e.dtype!r} compute on {e.model_dtype} parameters is mixed precision, which rlvr does not have: leave "
         "engine.dtype unset (computes in model_dtype) or set engine.model_dtype=bf16 to train in bfloat16"),
        (not e.qat.get("enable", False), "engine.qat.enable", "quantisation-aware training is not available"),
        (o.total_training_steps == -1, "optim.total_training_steps", "the trainer sets it (epochs x batches, or "
         "trainer.total_training_steps, as in verl); set trainer.total_training_steps instead"),
        (o.optimizer == "AdamW", "optim.optimizer", f"{o.optimizer!r}: rlvr trains with AdamW"),
        (o.optimizer_impl == "torch.optim", "optim.optimizer_impl", "rlvr uses torch.optim.AdamW"),
        (o.num_cycles == 0.5, "optim.num_cycles", "rlvr's cosine schedule is one half-cosine down (0.5)"),
        (o.zero_indexed_step, "optim.zero_indexed_step", "rlvr counts schedule steps from 0 (true)"),
        (o.override_optimizer_config is None, "optim.override_optimizer_config", "set AdamW's arguments with "
         "optim.lr / betas / weight_decay"),
        ((o.warmup_style or o.lr_scheduler_type) in ("constant", "cosine"), "optim.lr_scheduler_type",
         f"{o.warmup_style or o.lr_scheduler_type!r}: use constant or cosine"),
        (not d.balance_dp_token, "data.balance_dp_token", "verl does not implement it either; use data.use_dynamic_bsz"),
        (d.pad_mode in ("no_padding", "right"), "data.pad_mode", f"{d.pad_mode!r}: use no_padding or right"),
        (d.truncation in ("error", "left", "right"), "data.truncation", f"{d.truncation!r}: use error, left or right"),
        (d.enable_thinking_default in (None, "none", True, False), "data.enable_thinking_default",
         f"{d.enable_thinking_default!r}: use true, false or none"),
        (t.default_hdfs_dir is None, "trainer.default_hdfs_dir", "rlvr does not copy to HDFS; copy "
         "trainer.default_local_dir yourself"),
        (not cfg.profiler.enable, "profiler.enable", "profiling the SFT trainer is not available yet"),
        (list(t.profile_interval) == [-1, -1], "trainer.profile_interval", "profiling the SFT trainer is not "
         "available yet: leave [-1, -1]"),
    ]
    for ok, key, reason in rules:
        _require(ok, key, reason)
    saved = set(cfg.checkpoint.save_contents)
    _require({"model", "optimizer", "extra"} <= saved and saved <= {"model", "optimizer", "extra", "hf_model"},
             "checkpoint.save_contents", "rlvr's checkpoints always hold model, optimizer and extra (data position, "
             "RNG states) so that a resume continues exactly; add hf_model for a Hugging Face copy")
    loaded = cfg.checkpoint.load_contents
    _require(loaded is None or {"model", "optimizer", "extra"} <= set(loaded), "checkpoint.load_contents",
             "a resume restores model, optimizer and extra together; to start new training from a checkpoint's "
             "weights, merge it (python -m rlvr.model_merger) and set model.path to the merged folder")


_SPEED_SWITCHES = {  # key -> (the value that asks for nothing rlvr lacks, why another value changes nothing)
    "data.use_shm": (False, "rlvr reads the data files in place"),
    "data.num_workers": (8, "rlvr tokenizes the conversations once when they load; there are no loader workers"),
    "model.use_shm": (False, "rlvr loads the model from model.path in place"),
    "model.use_liger": (False, "Liger kernels are not used; the numbers are the same"),
    "model.use_fused_kernels": (False, "rlvr's one-rank path already computes log-probs without full logits"),
    "model.tiled_mlp.enabled": (False, "the MLP runs untiled; the numbers are the same"),
    "engine.wrap_policy.min_num_params": (0, "FSDP2 shards every decoder block and the root"),
    "engine.forward_prefetch": (False, "FSDP2 prefetches by itself"),
    "engine.use_orig_params": (False, "an FSDP1 setting; FSDP2 keeps the original parameters"),
    "engine.entropy_from_logits_with_chunking": (False, "the SFT loss computes no entropy"),
    "engine.entropy_checkpointing": (False, "the SFT loss computes no entropy"),
    "engine.use_torch_compile": (False, "the SFT forward runs eagerly; the numbers are the same"),
    "engine.use_no_sync_for_gradient_accumulation": (False, "gradients are reduced by FSDP2 after every backward"),
    "engine.pad_to_length": (False, "packed rows are not padded to buckets (a torch.compile aid)"),
    "trainer.balance_batch": (True, "as in verl's SFT trainer, rows are split evenly over the ranks"),
}


def _notes(cfg: DictConfig) -> list[str]:
    notes = []
    for key, (quiet, why) in _SPEED_SWITCHES.items():
        value = OmegaConf.select(cfg, key)
        if value != quiet:
            notes.append(f"{key}={value}: no effect in rlvr ({why})")
    if OmegaConf.to_container(cfg.engine.turbo_config) != TURBO_DEFAULTS:
        notes.append("engine.turbo_config: settings of another FSDP implementation; no effect in rlvr")
    if cfg.optim.warmup_style is not None:
        notes.append(f"optim.warmup_style={cfg.optim.warmup_style}: verl's deprecated name, taken as lr_scheduler_type")
    return notes


def _check_sizes(cfg: DictConfig, world: int) -> None:
    d, t = cfg.data, cfg.trainer
    _require(d.train_files is not None, "data.train_files", "no training data given: set it to a parquet or JSONL "
             "file of conversations (a 'messages' column)")
    for key in ("data.train_files", "data.val_files"):
        value = OmegaConf.select(cfg, key)
        for path in [] if value is None else ([value] if isinstance(value, str) else list(value)):
            _require(Path(path).is_file(), key, f"data file {path!r} does not exist")
            _require(Path(path).suffix in (".parquet", ".jsonl", ".json"), key,
                     f"{path!r} is neither .parquet nor .jsonl; convert it to one of these formats")
    _require(d.train_batch_size >= world and d.train_batch_size % world == 0, "data.train_batch_size",
             f"{d.train_batch_size} conversations do not split evenly over {world} ranks; use a multiple of {world}")
    _require(d.micro_batch_size_per_gpu >= 1, "data.micro_batch_size_per_gpu", "must be >= 1")
    _require(d.max_token_len_per_gpu >= 1 and d.max_length >= 2, "data.max_length", "must be >= 2 tokens")
    _require(t.total_epochs >= 1, "trainer.total_epochs", "must be >= 1")
    _require(t.total_training_steps is None or t.total_training_steps >= 1, "trainer.total_training_steps",
             "must be >= 1 (or null for total_epochs over the data)")
    for key in ("trainer.save_freq", "trainer.test_freq"):
        value = OmegaConf.select(cfg, key)
        _require(value == "after_each_epoch" or (isinstance(value, int) and (value == -1 or value > 0)), key,
                 f"{value!r}: use -1 (at the end), a step count > 0 or after_each_epoch")
    _require(t.max_ckpt_to_keep is None or t.max_ckpt_to_keep >= 1, "trainer.max_ckpt_to_keep", "keep at least 1")
    _require(t.resume_mode in ("auto", "disable", "resume_path"), "trainer.resume_mode",
             f"{t.resume_mode!r}: use auto, disable or resume_path")
    if t.resume_mode == "resume_path":
        _require(t.resume_from_path is not None and Path(t.resume_from_path).is_dir(), "trainer.resume_from_path",
                 f"resume_mode=resume_path needs a global_step_<k> folder, got {t.resume_from_path!r}")
    _require(t.call_timeout_s > 0, "trainer.call_timeout_s", "must be > 0 seconds")


def check_sft_config(cfg: DictConfig, launched_ranks: int | None = None) -> list[str]:
    """Check the whole SFT config before anything heavy starts; returns the start-up notes.

    Args:
        launched_ranks: the processes torchrun started (None: not under torchrun).

    Raises:
        ConfigError: naming the key and what to change.
    """
    t = cfg.trainer
    _require(t.backend in BACKENDS, "trainer.backend", f"{t.backend!r}{did_you_mean(t.backend, BACKENDS)}; use one "
             f"of {', '.join(BACKENDS)}")
    _require(launched_ranks is None or t.backend == "auto", "trainer.backend", "under torchrun every process is a "
             "rank already; leave trainer.backend=auto")
    _require(t.device in DEVICES, "trainer.device", f"{t.device!r}: use one of {', '.join(DEVICES)}")
    _require(t.nnodes >= 1 and t.n_gpus_per_node >= 1, "trainer.n_gpus_per_node", "nnodes and n_gpus_per_node must be >= 1")
    world = sft_world_size(cfg, launched_ranks)
    _require(t.backend != "local" or world == 1, "trainer.backend", "the local backend runs one rank in this "
             "process; use trainer.backend=process (one machine) or ray, or torchrun")
    for name in t.logger:
        _require(name in LOGGERS, "trainer.logger", f"unknown logger {name!r}; use any of {', '.join(LOGGERS)}")
    _refused(cfg)
    _check_sizes(cfg, world)
    _require(cfg.engine.ulysses_sequence_parallel_size == 1 or cfg.model.use_remove_padding,
             "engine.ulysses_sequence_parallel_size", "sequence parallelism splits packed rows: set "
             "model.use_remove_padding=true")
    return _notes(cfg)
