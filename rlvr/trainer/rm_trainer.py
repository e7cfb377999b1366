"""The reward-model trainer: Bradley-Terry on preference pairs, for ``reward.reward_model``.

``python -m rlvr.trainer.rm_trainer [--preset NAME] rm.train_files=pairs.jsonl [rm.KEY=VALUE ...] [run keys]``

A pair is a row ``{"prompt": [chat messages], "chosen": str, "rejected": str}`` (``.jsonl`` or
``.parquet``; :mod:`rlvr.data_prep.rm_pairs` makes them from a policy's own samples). Each side's
input is the reward model's input exactly as the reward-model worker builds it at training time
(:func:`rlvr.reward.reward_model.rm_chat`: the conversation with the response, in the reward
model's chat template), so the trained model scores at RL time the text it was trained on.

It reuses the trainer's parts: the run config and its ``trainer`` section (backend, device, seed,
threads, loggers, run directory), the worker groups (:class:`~rlvr.workers.rm_training.RewardModelTrainingWorker`,
FSDP2 over ``trainer.n_gpus_per_node`` ranks on Ray or one in the driver), the optimizer, schedule
and update loop of the actor, the data readers, the loggers (``metrics.jsonl``) and the Hugging Face
export. The ``rm.*`` keys are :class:`RMTrainerConfig`. It writes ``<run dir>/hf_model`` (the
reward model) and ``<run dir>/rm_summary.json`` (held-out pair accuracy before and after).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
from omegaconf import DictConfig, OmegaConf

from rlvr.trainer.config import load_config
from rlvr.trainer.config.schema import OptimConfig
from rlvr.utils.errors import ConfigError, DataError

__all__ = ["RMTrainerConfig", "RewardModelTrainer", "main"]


@dataclass
class RMTrainerConfig:
    """The RM trainer's own settings (``rm.*`` on its command line)."""

    train_files: Any = field(default=None, metadata={"help": "preference pairs: a .jsonl/.parquet path or a list (prompt, chosen, rejected)"})
    val_files: Any = field(default=None, metadata={"help": "held-out pairs for the pair accuracy; None: none"})
    model_path: Optional[str] = field(default=None, metadata={"help": "base model that gets the score head (None = actor_rollout_ref.model.path)"})
    dtype: str = field(default="float32", metadata={"help": "parameter dtype: float32 | bfloat16"})
    epochs: int = field(default=1, metadata={"help": "passes over the training pairs"})
    batch_size: int = field(default=32, metadata={"help": "pairs per optimizer step (over all ranks)"})
    micro_batch_size: int = field(default=8, metadata={"help": "pairs per forward on one rank (gradient accumulation)"})
    max_length: int = field(default=512, metadata={"help": "longest reward-model input in tokens; a longer pair is refused"})
    grad_clip: float = field(default=1.0, metadata={"help": "max global gradient norm"})
    eval_every: int = field(default=0, metadata={"help": "held-out pair accuracy every N steps (0: before and after only)"})
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5, warmup_steps_ratio=0.1, lr_scheduler_type="cosine", min_lr_ratio=0.1, weight_decay=0.0), metadata={"help": "optimizer and schedule (total_training_steps is set from the data)"})


def _paths(value: Any) -> list[str]:
    return [] if value is None else [str(v) for v in value] if isinstance(value, (list, tuple)) or OmegaConf.is_list(value) else [str(value)]


def load_pairs(files: Any, what: str) -> list[dict]:
    """The pair rows of ``files``; a row without ``prompt``, ``chosen`` or ``rejected`` is a DataError."""
    from rlvr.trainer.data import read_rows

    rows = [row for path in _paths(files) for row in read_rows(path)]
    for index, row in enumerate(rows):
        missing = [key for key in ("prompt", "chosen", "rejected") if key not in row]
        if missing:
            raise DataError(f"{what} row {index} lacks {missing}; a pair row has prompt (chat messages), chosen, rejected")
    return rows


class RewardModelTrainer:
    """Train a reward model on pairs (see the module docstring).

    Args:
        config: the run config (``trainer`` section: backend, device, seed, loggers, run directory).
        rm: the RM trainer's settings.
    """

    def __init__(self, config: DictConfig, rm: DictConfig) -> None:
        from rlvr.utils.model import load_tokenizer

        if rm.train_files is None:
            raise ConfigError("rm.train_files", "no training pairs given; make them with `python -m rlvr.data_prep.rm_pairs`")
        if rm.model_path is None:
            rm.model_path = config.actor_rollout_ref.model.path
        self.config, self.rm = config, rm
        self.tokenizer = load_tokenizer(rm.model_path)
        self.train = self._tensors(load_pairs(rm.train_files, "rm.train_files"), "rm.train_files")
        self.val = self._tensors(load_pairs(rm.val_files, "rm.val_files"), "rm.val_files") if rm.val_files else None
        rows = len(self.train["chosen_input_ids"])
        self.steps_per_epoch = math.ceil(rows / rm.batch_size)
        rm.optim.total_training_steps = self.steps_per_epoch * rm.epochs
        self.run_dir = Path(config.trainer.default_local_dir)

    def _tensors(self, rows: list[dict], key: str) -> dict[str, Any]:
        """Token ids of both sides of every pair, as the reward-model worker builds them."""
        from rlvr.reward.reward_model import rm_chat, rm_tokenize

        sides: dict[str, list[list[int]]] = {"chosen": [], "rejected": []}
        for index, row in enumerate(rows):
            for side in sides:
                ids = rm_tokenize(rm_chat(row["prompt"], str(row[side]), self.tokenizer), self.tokenizer)
                if len(ids) > self.rm.max_length:
                    raise DataError(f"{key} pair {index}: its {side} input has {len(ids)} tokens, more than "
                                    f"rm.max_length={self.rm.max_length}; raise it or drop the pair")
                sides[side].append(ids)
        return {f"{side}_input_ids": ids for side, ids in sides.items()}

    def _batch(self, data: dict[str, list[list[int]]], index: Sequence[int]):
        """A DataProto of the pairs ``index``: ``<side>_input_ids`` / ``<side>_attention_mask``, right-padded."""
        import torch

        from rlvr.protocol import DataProto

        tensors = {}
        for side in ("chosen", "rejected"):
            rows = [data[f"{side}_input_ids"][i] for i in index]
            longest = max(len(r) for r in rows)
            ids = torch.full((len(rows), longest), self.tokenizer.pad_token_id, dtype=torch.long)
            mask = torch.zeros((len(rows), longest), dtype=torch.long)
            for i, row in enumerate(rows):
                ids[i, :len(row)], mask[i, :len(row)] = torch.tensor(row), 1
            tensors[f"{side}_input_ids"], tensors[f"{side}_attention_mask"] = ids, mask
        return DataProto.from_dict(tensors=tensors)

    def _start(self):
        from rlvr.single_controller import ClassWithInitArgs, get_resource_pool_cls, get_worker_group_cls
        from rlvr.workers.rm_training import RewardModelTrainingWorker

        t = self.config.trainer
        backend = t.backend
        processes = [1] if backend == "local" else [t.n_gpus_per_node] * t.nnodes
        self.pool = get_resource_pool_cls(backend)(process_on_nodes=processes, use_gpu=t.device == "cuda",
                                                   name_prefix="rm")
        self.group = get_worker_group_cls(backend)(self.pool, ClassWithInitArgs(RewardModelTrainingWorker, self.config,
                                                                                self.rm),
                                                   name_prefix="rm_trainer", call_timeout_s=float(t.call_timeout_s))
        self.group.init_model()

    def pair_accuracy(self) -> float:
        """Share of held-out pairs whose chosen side scores higher (NaN without held-out pairs)."""
        if self.val is None:
            return float("nan")
        rows = len(self.val["chosen_input_ids"])
        out = self.group.score_pairs(self._batch(self.val, range(rows)))
        return float((out.batch["chosen_scores"] > out.batch["rejected_scores"]).float().mean())

    def fit(self) -> dict[str, float]:
        """Train, log, export; returns the summary (also written to ``rm_summary.json``)."""
        from rlvr.trainer.ppo.metric_utils import reduce_metrics
        from rlvr.trainer.tracking import Tracking

        t = self.config.trainer
        tracker = Tracking(t.project_name, t.experiment_name, list(t.logger), self.run_dir,
                           OmegaConf.to_container(self.config, resolve=True))
        self._start()
        try:
            before = self.pair_accuracy()
            tracker.log({"rm/val_pair_accuracy": before}, step=0)
            rng = np.random.default_rng(int(t.seed))
            rows, step = len(self.train["chosen_input_ids"]), 0
            for _ in range(int(self.rm.epochs)):
                order = rng.permutation(rows)
                for start in range(0, rows, int(self.rm.batch_size)):
                    step += 1
                    output = self.group.train_step(self._batch(self.train, order[start:start + int(self.rm.batch_size)]))
                    metrics = reduce_metrics(output.meta_info["metrics"])
                    if self.rm.eval_every and step % int(self.rm.eval_every) == 0:
                        metrics["rm/val_pair_accuracy"] = self.pair_accuracy()
                    tracker.log(metrics, step=step)
            after = self.pair_accuracy()
            tracker.log({"rm/val_pair_accuracy": after}, step=step)
            self.group.export(str(self.run_dir / "hf_model"))
        finally:
            tracker.finish()
            self.group.shutdown()
            self.pool.remove()
        summary = {"train_pairs": rows, "val_pairs": 0 if self.val is None else len(self.val["chosen_input_ids"]),
                   "steps": step, "val_pair_accuracy_before": before, "val_pair_accuracy_after": after,
                   "model": str(self.run_dir / "hf_model")}
        (self.run_dir / "rm_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        return summary


def split_overrides(overrides: Sequence[str]) -> tuple[list[str], list[str]]:
    """``(rm.* overrides without the prefix, the run config's overrides)``."""
    rm = [item[len("rm."):] for item in overrides if item.startswith("rm.")]
    return rm, [item for item in overrides if not item.startswith("rm.")]


def load_rm_config(overrides: Sequence[str]) -> DictConfig:
    """:class:`RMTrainerConfig` with ``key=value`` overrides (an unknown key is a ConfigError)."""
    try:
        return OmegaConf.merge(OmegaConf.structured(RMTrainerConfig), OmegaConf.from_dotlist(list(overrides)))
    except Exception as err:  # noqa: BLE001 - OmegaConf's key and type errors, named for the user
        raise ConfigError("rm", f"{err}".splitlines()[0] + "; `python -m rlvr.trainer.rm_trainer --help` lists the rm.* keys") from None


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module docstring); returns the exit code."""
    parser = argparse.ArgumentParser(prog="rlvr-rm", description="Train a reward model on preference pairs "
                                     "(Bradley-Terry). rm.* keys: " + ", ".join(RMTrainerConfig.__dataclass_fields__))
    parser.add_argument("--preset", default=None, help="run preset for the trainer section (backend, device, loggers)")
    parser.add_argument("overrides", nargs="*", help="rm.KEY=VALUE and run-config key=value overrides")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    rm_overrides, run_overrides = split_overrides(args.overrides)
    try:
        rm = load_rm_config(rm_overrides)
        config = load_config(args.preset, run_overrides)
        summary = RewardModelTrainer(config, rm).fit()
    except (ConfigError, DataError) as err:
        print(f"rlvr-rm: {err}", file=sys.stderr)
        return 2
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
