"""Supervised fine-tuning on multi-turn conversations (verl's ``verl.trainer.sft_trainer``)::

    python -m rlvr.trainer.sft_trainer data.train_files=chats.parquet model.path=Qwen/Qwen2.5-0.5B-Instruct \\
        trainer.default_local_dir=runs/sft
    torchrun --nproc_per_node=4 -m rlvr.trainer.sft_trainer ...          # one process per rank

verl 0.9.1's ``sft_trainer_engine.yaml`` keys (:mod:`rlvr.trainer.config.sft_schema`; what each does
in rlvr: :mod:`rlvr.trainer.config.sft_check` and ``docs/sft.md``). The trainer is built from the
PPO trainer's parts: the data files are read like the RL data (:mod:`rlvr.trainer.data.sft_dataset`),
the model is the actor worker's (:class:`~rlvr.workers.sft_worker.SFTWorker`: FSDP2 over the ranks,
packing with ``model.use_remove_padding``, LoRA), a step is one optimizer step of the actor's update
loop with the NLL of the assistant tokens (token-mean over the whole batch), checkpoints are the
run checkpoints of :mod:`rlvr.trainer.checkpoint` (whole or absent, resumed exactly), metrics go to
the trainer's loggers. At the end the model is written to ``<default_local_dir>/hf_model``, a
Hugging Face folder that ``actor_rollout_ref.model.path`` loads.

The ranks run as the worker group of ``trainer.backend``: under torchrun every process is a rank
(:class:`~rlvr.single_controller.spmd.SPMDWorkerGroup`), otherwise one rank in this process
(``local``), several child processes on this machine (``process``) or Ray workers (``ray``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlvr.trainer.config import help_config
from rlvr.trainer.config.sft_check import DTYPES, check_sft_config, load_sft_config, sft_world_size
from rlvr.trainer.config.sft_schema import SFTConfig
from rlvr.utils.errors import ConfigError, DataError, WorkerError

__all__ = ["SFTTrainer", "create_sft_dataset", "worker_config", "run_sft", "main"]

logger = logging.getLogger(__name__)


def create_sft_dataset(data_paths, data_config, tokenizer, processor=None, max_samples=-1):
    """verl's factory at verl's path (see :func:`rlvr.trainer.data.sft_dataset.create_sft_dataset`)."""
    from rlvr.trainer.data.sft_dataset import create_sft_dataset as create

    return create(data_paths, data_config, tokenizer, processor, max_samples)


def worker_config(cfg: DictConfig, world_size: int, total_steps: int) -> DictConfig:
    """The run config (``RlvrConfig``) the actor worker reads, from the SFT config: the model, the
    engine's FSDP2 settings, the optimizer and schedule, batch sizes (one optimizer step per batch:
    the mini-batch is the whole batch), micro-batching and the worker's seed and threads."""
    from rlvr.trainer.config.schema import RlvrConfig

    run = OmegaConf.structured(RlvrConfig)
    m, e, o, d, t = cfg.model, cfg.engine, cfg.optim, cfg.data, cfg.trainer
    model = run.actor_rollout_ref.model
    model.path, model.tokenizer_path, model.dtype = m.path, m.tokenizer_path, DTYPES[e.model_dtype]
    model.enable_gradient_checkpointing, model.use_remove_padding = m.enable_gradient_checkpointing, m.use_remove_padding
    model.trust_remote_code, model.external_lib = m.trust_remote_code, m.external_lib
    model.lora_rank, model.lora_alpha, model.target_modules = m.lora_rank, m.lora_alpha, m.target_modules
    actor = run.actor_rollout_ref.actor
    actor.ppo_mini_batch_size, actor.ppo_epochs, actor.shuffle = d.train_batch_size, 1, False
    actor.ppo_micro_batch_size_per_gpu, actor.use_dynamic_bsz = d.micro_batch_size_per_gpu, d.use_dynamic_bsz
    actor.ppo_max_token_len_per_gpu, actor.grad_clip = d.max_token_len_per_gpu, o.clip_grad
    actor.ulysses_sequence_parallel_size, actor.share_prompt_forward = e.ulysses_sequence_parallel_size, False
    actor.fsdp_config.param_offload, actor.fsdp_config.optimizer_offload = e.param_offload, e.optimizer_offload
    actor.fsdp_config.reshard_after_forward = e.reshard_after_forward
    optim = actor.optim
    optim.lr, optim.betas, optim.weight_decay, optim.min_lr_ratio = o.lr, list(o.betas), o.weight_decay, o.min_lr_ratio
    optim.warmup_steps, optim.warmup_steps_ratio = max(o.lr_warmup_steps, 0), o.lr_warmup_steps_ratio
    optim.lr_scheduler_type, optim.total_training_steps = o.warmup_style or o.lr_scheduler_type, total_steps
    rollout = run.actor_rollout_ref.rollout
    rollout.n, rollout.log_prob_micro_batch_size_per_gpu = 1, d.micro_batch_size_per_gpu
    rollout.log_prob_use_dynamic_bsz, rollout.log_prob_max_token_len_per_gpu = d.use_dynamic_bsz, d.max_token_len_per_gpu
    trainer = run.trainer
    trainer.seed, trainer.num_threads, trainer.call_timeout_s = e.seed, t.num_threads, t.call_timeout_s
    trainer.backend = "local" if world_size == 1 else "process"  # how many ranks share the cores (CPU threads)
    trainer.nnodes, trainer.n_gpus_per_node = 1, world_size
    return run


@dataclass
class _Driver:
    """The driver's one-off work under a torchrun job (rank 0 does it; the others wait), or a lone driver."""

    lead: bool = True
    barrier: Callable[[], None] | None = None
    share: Callable[[Any], Any] = lambda value: value


def _uses_gpu(device: str) -> bool:
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("trainer.device", "cuda was asked for but no GPU is visible; set trainer.device=cpu")
    return device != "cpu" and torch.cuda.is_available()


def build_worker_group(cfg: DictConfig, run: DictConfig, launched_ranks: int | None) -> tuple[Any, _Driver]:
    """The SFT worker group of ``trainer.backend`` (see the module docstring) and the driver's role in it."""
    from rlvr.single_controller import ClassWithInitArgs
    from rlvr.single_controller.backend import start_worker_group
    from rlvr.single_controller.spmd import SPMDWorkerGroup
    from rlvr.workers.sft_worker import SFTWorker

    t = cfg.trainer
    worker = ClassWithInitArgs(SFTWorker, run, cfg.model.custom_chat_template)
    if launched_ranks is not None:
        group = SPMDWorkerGroup(worker, call_timeout_s=t.call_timeout_s, name_prefix="sft")
        return group, _Driver(group.is_lead, group.barrier, group.from_lead)
    world = sft_world_size(cfg, None)
    backend = t.backend if t.backend != "auto" else "local" if world == 1 else "process" if t.nnodes == 1 else "ray"
    use_gpu = _uses_gpu(t.device)
    if backend == "ray":
        import ray

        from rlvr.single_controller import init_ray

        if not ray.is_initialized():
            init_ray(num_cpus=None if use_gpu else world)
    group = start_worker_group(backend, [t.n_gpus_per_node] * t.nnodes, use_gpu, worker, t.call_timeout_s, "sft")
    return group, _Driver()


def _frequency(value: Any, steps_per_epoch: int) -> int:
    return steps_per_epoch if value == "after_each_epoch" else int(value)


class SFTTrainer:
    """The SFT run: data, the worker group, checkpoints and the loop (verl's class name).

    Args:
        config: the SFT config (:class:`~rlvr.trainer.config.sft_schema.SFTConfig`), checked.
        launched_ranks: the processes torchrun started (None: not under torchrun).
    """

    def __init__(self, config: DictConfig, launched_ranks: int | None = None) -> None:
        from rlvr.trainer.checkpoint import RunCheckpoints
        from rlvr.trainer.data import SeededRandomSampler, StatefulBatchIterator
        from rlvr.utils.tokenizer import hf_tokenizer

        self.config = config
        d, t = config.data, config.trainer
        self.tokenizer = hf_tokenizer(config.model.tokenizer_path or config.model.path,
                                      trust_remote_code=config.model.trust_remote_code)
        if config.model.custom_chat_template is not None:
            self.tokenizer.chat_template = config.model.custom_chat_template
        self.train_dataset = create_sft_dataset(d.train_files, d, self.tokenizer, max_samples=d.train_max_samples)
        self.val_dataset = (create_sft_dataset(d.val_files, d, self.tokenizer, max_samples=d.val_max_samples)
                            if d.val_files else None)
        self.world_size = sft_world_size(config, launched_ranks)
        self.train_iter = StatefulBatchIterator(self.train_dataset, d.train_batch_size,
                                                SeededRandomSampler(self.train_dataset, seed=t.seed), self._collate)
        self.steps_per_epoch = len(self.train_iter)
        self.total_training_steps = t.total_training_steps or self.steps_per_epoch * t.total_epochs
        self.save_freq = _frequency(t.save_freq, self.steps_per_epoch)
        self.test_freq = _frequency(t.test_freq, self.steps_per_epoch)
        run = worker_config(config, self.world_size, self.total_training_steps)
        self.group, self.driver = build_worker_group(config, run, launched_ranks)
        self.group.init_model()
        self.run_dir = Path(t.default_local_dir)
        self.checkpoints = RunCheckpoints(self.run_dir, t.max_ckpt_to_keep)
        self.global_step, self.total_tokens = 0, 0
        self.val_losses: list[tuple[int, float]] = []
        self._resume()

    def _collate(self, items: list[dict]) -> dict:
        from rlvr.trainer.data.sft_dataset import collate_sft_batch

        pad_to = self.config.data.max_length if self.config.data.pad_mode == "right" else None
        return collate_sft_batch(items, self.tokenizer.pad_token_id, pad_to)

    # ------------------------------------------------------------------ checkpoints
    def _resume(self) -> None:
        t = self.config.trainer
        path = self.driver.share(self.checkpoints.to_resume(t.resume_mode, t.resume_from_path)
                                 if self.driver.lead else None)
        if path is None:
            return
        state = self.checkpoints.load(Path(path), {"actor": self.group})
        self.global_step, self.total_tokens = int(state["global_steps"]), int(state["total_tokens"])
        self.train_iter.load_state_dict(state["data"])
        logger.info("resumed from %s at step %d", path, self.global_step)

    def save_checkpoint(self) -> Path:
        """Write ``<default_local_dir>/global_step_<k>``: the actor's files (and, with ``hf_model`` in
        ``checkpoint.save_contents``, a Hugging Face copy in ``actor/huggingface``), the data position."""
        step = self.global_step
        groups = {"actor": _WithHFCopy(self.group) if "hf_model" in self.config.checkpoint.save_contents else self.group}
        state = {"global_steps": step, "total_tokens": self.total_tokens, "data": self.train_iter.state_dict()}
        return self.checkpoints.save(step, groups, state, self.driver.lead, self.driver.barrier)

    # ------------------------------------------------------------------ the loop
    def validate(self) -> float:
        """Token-mean SFT loss over the whole validation set (``val/loss``)."""
        from rlvr.protocol import DataProto

        nll = tokens = 0.0
        size = self.config.data.train_batch_size
        for start in range(0, len(self.val_dataset), size):
            items = [self.val_dataset[i] for i in range(start, min(start + size, len(self.val_dataset)))]
            while len(items) % self.world_size:  # a copy that counts nothing, so every rank gets rows
                items.append({"input_ids": items[-1]["input_ids"], "loss_mask": items[-1]["loss_mask"] * 0})
            metrics = self.group.infer_batch(DataProto.from_single_dict(self._collate(items))).meta_info["metrics"]
            nll, tokens = nll + metrics["val/nll_sum"][0], tokens + metrics["val/tokens"][0]
        return nll / max(tokens, 1.0)

    def _step(self) -> dict[str, float]:
        from rlvr.protocol import DataProto
        from rlvr.trainer.ppo.metric_utils import reduce_metrics

        started = time.perf_counter()
        batch = DataProto.from_single_dict(next(self.train_iter), meta_info={"temperature": 1.0})
        output = self.group.train_batch(batch)
        metrics = reduce_metrics(output.meta_info["metrics"])
        tokens = int(batch.batch["attention_mask"].sum())
        self.total_tokens += tokens
        self.global_step += 1
        metrics.update({"train/global_tokens": float(tokens), "train/total_tokens(B)": self.total_tokens / 1e9,
                        "train/epoch": float(self.train_iter.epoch), "timing_s/step": time.perf_counter() - started})
        return metrics

    def fit(self) -> list[dict[str, float]]:
        """Train to ``total_training_steps``; returns the logged metrics of each step."""
        from rlvr.trainer.progress import TrainingProgress
        from rlvr.trainer.tracking import Tracking

        t = self.config.trainer
        tracking = (Tracking(t.project_name, t.experiment_name, list(t.logger), self.run_dir,
                             OmegaConf.to_container(self.config, resolve=True), resume_step=self.global_step or None)
                    if self.driver.lead else None)
        progress = TrainingProgress(self.total_training_steps, self.global_step, None, t.progress_bar and self.driver.lead)
        history = []
        try:
            while self.global_step < self.total_training_steps:
                metrics = self._step()
                step, last = self.global_step, self.global_step == self.total_training_steps
                if self.val_dataset is not None and (last or (self.test_freq > 0 and step % self.test_freq == 0)):
                    metrics["val/loss"] = self.validate()
                    self.val_losses.append((step, metrics["val/loss"]))
                if tracking is not None:
                    tracking.log(metrics, step)
                history.append({"step": step, **metrics})
                progress.update(metrics["timing_s/step"], metrics)
                if last or (self.save_freq > 0 and step % self.save_freq == 0):
                    self.save_checkpoint()
            if t.export_hf:
                self.group.export_hf(str(self.run_dir / "hf_model"))
        finally:
            progress.close()
            if tracking is not None:
                tracking.finish()
        return history

    def shutdown(self) -> None:
        self.group.shutdown()


class _WithHFCopy:
    """A worker group whose ``save_checkpoint`` also writes a Hugging Face copy into the checkpoint
    (``checkpoint.save_contents`` with ``hf_model``: ``actor/huggingface``, verl's place for it)."""

    def __init__(self, group: Any) -> None:
        self.group = group

    def save_checkpoint(self, path: str) -> None:
        self.group.save_checkpoint(path)
        self.group.export_hf(str(Path(path) / "huggingface"))

    def get_rng_state(self) -> list:
        return self.group.get_rng_state()


def run_sft(config: DictConfig, launched_ranks: int | None = None) -> SFTTrainer:
    """Check ``config``, train, shut the workers down; returns the trainer (its ``val_losses``)."""
    notes = check_sft_config(config, launched_ranks)
    if os.environ.get("RANK", "0") == "0":  # under torchrun, once
        for note in notes:
            logger.info("note: %s", note)
    if config.trainer.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the workers pick a GPU whenever one is visible
    from rlvr.utils.user_code import import_user_modules

    import_user_modules(config.model.external_lib)
    trainer = SFTTrainer(config, launched_ranks)
    try:
        trainer.fit()
    finally:
        trainer.shutdown()
    return trainer


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m rlvr.trainer.sft_trainer [--config-path DIR --config-name NAME] key=value ...``;
    returns 0, 2 for a config or data error, 1 when a worker failed."""
    from rlvr.single_controller.spmd import launched_by_torchrun

    parser = argparse.ArgumentParser(prog="python -m rlvr.trainer.sft_trainer",
                                     description="Supervised fine-tuning on multi-turn conversations (verl's keys).")
    parser.add_argument("--config-path", default=None, help="folder of a YAML config composed on the defaults")
    parser.add_argument("--config-name", default=None, help="that YAML's name (without .yaml)")
    parser.add_argument("--help-config", action="store_true", help="print every config key and exit")
    parser.add_argument("overrides", nargs="*", help="key=value overrides (Hydra's grammar)")
    args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    if args.help_config:
        sys.stdout.write(help_config(SFTConfig))
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config_file = (Path(args.config_path or ".") / f"{args.config_name.removesuffix('.yaml')}.yaml"
                   if args.config_name else None)
    try:
        config = load_sft_config(args.overrides, config_file)
        run_sft(config, launched_by_torchrun())
    except (ConfigError, DataError) as err:
        print(f"rlvr sft_trainer: {err}", file=sys.stderr)
        return 2
    except WorkerError as err:
        print(f"rlvr sft_trainer: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
