"""Validation and the run report of the PPO trainer (a mixin of
:class:`~rlvr.trainer.ppo.ray_trainer.RayPPOTrainer`).

Validation generates ``rollout.val_kwargs.n`` responses for every prompt of the validation set with
the sampling settings of ``rollout.val_kwargs`` (``do_sample``, ``temperature``, ``top_p``,
``top_k``; greedy by default), scores them with the validation reward function and reports:

- verl's metrics (:func:`~rlvr.trainer.ppo.validation_metrics.compute_validation_metrics`):
  ``val-core/<source>/<var>/mean@N``, ``best@k``, ``maj@k``, ``val-aux/...`` over the variables
  ``reward`` (the sequence score) and every per-sample extra of the reward function (``acc``,
  ``pred``, ...), plus rlvr's unbiased ``pass@k``; ``val-aux/num_turns/*`` for multi-turn rollouts;
- rlvr's summary ``val/<source>/acc``, ``val/<source>/score``, ``val/acc`` (acc: the reward's ``acc``
  or score >= 1) and, for multi-turn rollouts, ``val/agent/tool_use_rate`` and ``correct_with_tool``.

The samples go to ``trainer.validation_data_dir/<step>.jsonl`` when set; ``trainer.log_val_generations``
of them (verl's pick) go to the loggers as a table, and the first ones with their images and whole
transcripts are kept for the report's sample table.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import numpy as np

from rlvr.agent.metrics import tool_use_metrics, transcript
from rlvr.protocol import DataProto
from rlvr.trainer.generations import batch_texts, pick_val_generations, reward_extra_columns, write_generations
from rlvr.trainer.ppo.metric_utils import compute_validation_metrics, per_source_metrics
from rlvr.trainer.report import first_and_last_generations, metric_summary, write_report
from rlvr.trainer.tracking import read_metrics
from rlvr.utils.multimodal import MULTI_MODAL_DATA

__all__ = ["ValidationMixin"]


class _ValidationSamples:
    """Per-sample columns of one validation, gathered batch by batch."""

    def __init__(self) -> None:
        self.sources: list[str] = []
        self.uids: list[str] = []
        self.inputs: list[str] = []
        self.outputs: list[str] = []
        self.gts: list[Any] = []
        self.scores: list[float] = []
        self.accs: list[float] = []
        self.tool_calls: list[Any] = []
        self.turns: list[int] = []
        self.extras: dict[str, list[Any]] = {}

    def add(self, batch: DataProto, tokenizer: Any) -> None:
        """Append a scored batch's rows (every column keeps one value per sample)."""
        inputs, outputs, gts, scores = batch_texts(batch, tokenizer)
        done = len(self.scores)
        for key, values in reward_extra_columns(batch).items():
            self.extras.setdefault(key, [None] * done).extend(values)
        for values in self.extras.values():
            values.extend([None] * (done + len(batch) - len(values)))
        self.sources += [str(s) for s in batch.non_tensor_batch["data_source"]]
        self.uids += batch.non_tensor_batch["uid"].tolist()
        self.inputs, self.outputs, self.gts, self.scores = (self.inputs + inputs, self.outputs + outputs,
                                                            self.gts + gts, self.scores + scores)
        self.accs += batch.non_tensor_batch["acc"].tolist()
        self.tool_calls += batch.non_tensor_batch.get("num_tool_calls", np.full(len(batch), None)).tolist()
        if "num_turns" in batch.non_tensor_batch:
            self.turns += batch.non_tensor_batch["num_turns"].tolist()

    def infos(self) -> dict[str, list[Any]]:
        """verl's variables: ``reward`` (the sequence score) first, then the reward extras."""
        return {"reward": self.scores, **self.extras}


class ValidationMixin:
    """``_validate`` and ``_write_report`` of the trainer (they use its config, datasets, worker
    groups, reward function, tokenizer, tracker, ``val_generations``, ``metrics_history``,
    ``recovery`` and ``run_dir``)."""

    def _validate(self) -> dict[str, float]:
        """Generate ``val_kwargs.n`` responses per validation prompt, score them; returns the
        metrics of the module docstring (and writes / logs the samples)."""
        cfg = self.config
        if self.async_rollout is not None:  # the rollout apart may hold older weights (trigger_parameter_sync_step)
            self.async_rollout.sync_weights()
        val_n = cfg.actor_rollout_ref.rollout.val_kwargs.n
        size = cfg.data.val_batch_size or len(self.val_dataset)
        samples = _ValidationSamples()
        for start in range(0, len(self.val_dataset), size):
            rows = range(start, min(start + size, len(self.val_dataset)))
            batch = DataProto.from_single_dict(self.collate_fn([self.val_dataset[i] for i in rows]))
            batch.non_tensor_batch["uid"] = np.array([f"val-{i}" for i in rows], dtype=object)
            batch = batch.repeat(val_n, interleave=True)
            with self.async_rollout.trainer_waiting() if self.async_rollout is not None else nullcontext():
                batch = self._generate(batch, validate=True)
            self._score(batch, self.val_reward_fn)
            samples.add(batch, self.tokenizer)
            self._keep_generations(batch, batch.batch["token_level_scores"].sum(-1).tolist())
        self._write_val_generations(samples)
        metrics = compute_validation_metrics(samples.sources, samples.uids, samples.infos(), seed=42,
                                             sample_turns=samples.turns or None)
        metrics.update(per_source_metrics("val", samples.sources, samples.scores, samples.accs))
        metrics.update(tool_use_metrics("val", samples.accs, samples.tool_calls))
        return metrics

    def _write_val_generations(self, samples: _ValidationSamples) -> None:
        """``trainer.validation_data_dir/<step>.jsonl`` and the loggers' sample table."""
        trainer = self.config.trainer
        if trainer.validation_data_dir:
            write_generations(trainer.validation_data_dir, self.global_steps, samples.inputs, samples.outputs,
                              samples.gts, samples.scores, samples.infos())
        picked = pick_val_generations(samples.inputs, samples.outputs, samples.scores, trainer.log_val_generations)
        self.tracker.log_generations(picked, self.global_steps)

    def _keep_generations(self, batch: DataProto, seq_scores: list[float]) -> None:
        """The first ``log_val_generations`` samples of this validation, whole, for the report."""
        limit = self.config.trainer.log_val_generations
        taken = sum(1 for g in self.val_generations if g["step"] == self.global_steps)
        response_len = batch.batch["responses"].shape[1]
        images = batch.non_tensor_batch.get(MULTI_MODAL_DATA)  # shown in the report's sample table
        for i in range(min(limit - taken, len(batch))):
            self.val_generations.append({
                "step": self.global_steps,
                "prompt": batch.non_tensor_batch["raw_prompt"][i][-1]["content"],  # the last (user) message
                "response": transcript(self.tokenizer, batch.batch["responses"][i], batch.batch["response_mask"][i],
                                       batch.batch["attention_mask"][i, -response_len:]),
                "ground_truth": batch.non_tensor_batch["reward_model"][i].get("ground_truth"),
                "score": seq_scores[i],
                "images": list((images[i] or {}).get("image", [])) if images is not None else []})

    def _write_report(self, train_time_s: float) -> None:
        jsonl = self.run_dir / "metrics.jsonl"
        rows = read_metrics(jsonl) if jsonl.is_file() else self.metrics_history
        summary: dict[str, Any] = {
            "algorithm": self.config.algorithm.adv_estimator, "model": self.config.actor_rollout_ref.model.path,
            "steps": self.global_steps, "training wall time (s)": round(train_time_s, 1), **metric_summary(rows),
            "worker restarts": len(self.recovery.failures)}
        write_report(self.run_dir, rows, first_and_last_generations(self.val_generations), summary,
                     self.recovery.report_rows())
