"""Validation and the run report of the PPO trainer (a mixin of
:class:`~rlvr.trainer.ppo.ray_trainer.RayPPOTrainer`).

Validation generates on the whole validation set with ``rollout.val_kwargs`` (greedy by default),
scores it with the validation reward function and reports ``val/<source>/acc``, ``val/<source>/score``,
``val/acc`` and, for multi-turn rollouts, ``val/agent/tool_use_rate`` and ``correct_with_tool``. The
first ``trainer.log_val_generations`` samples of each validation are kept (whole transcripts, the
inserted spans marked, and their images) for the report's sample table.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import numpy as np

from rlvr.agent.metrics import tool_use_metrics, transcript
from rlvr.protocol import DataProto
from rlvr.trainer.ppo.metrics import per_source_metrics
from rlvr.trainer.report import first_and_last_generations, metric_summary, write_report
from rlvr.trainer.tracking import read_metrics
from rlvr.utils.multimodal import MULTI_MODAL_DATA

__all__ = ["ValidationMixin"]


class ValidationMixin:
    """``_validate`` and ``_write_report`` of the trainer (they use its config, datasets, worker
    groups, reward function, ``val_generations``, ``metrics_history``, ``recovery`` and ``run_dir``)."""

    def _validate(self) -> dict[str, float]:
        """Greedy (``rollout.val_kwargs``) generation on the validation set; ``val/<source>/acc``,
        ``val/<source>/score`` and ``val/acc``. Sample generations are kept for the report."""
        cfg = self.config
        if self.async_rollout is not None:  # the rollout apart may hold older weights (trigger_parameter_sync_step)
            self.async_rollout.sync_weights()
        val_n = cfg.actor_rollout_ref.rollout.val_kwargs.n
        size = cfg.data.val_batch_size or len(self.val_dataset)
        sources, scores, accs, tool_calls = [], [], [], []
        for start in range(0, len(self.val_dataset), size):
            items = [self.val_dataset[i] for i in range(start, min(start + size, len(self.val_dataset)))]
            batch = DataProto.from_single_dict(self.collate_fn(items)).repeat(val_n, interleave=True)
            with self.async_rollout.trainer_waiting() if self.async_rollout is not None else nullcontext():
                batch = self._generate(batch, validate=True)
            self._score(batch, self.val_reward_fn)
            seq_scores = batch.batch["token_level_scores"].sum(-1).tolist()
            sources += batch.non_tensor_batch["data_source"].tolist()
            scores += seq_scores
            accs += batch.non_tensor_batch["acc"].tolist()
            tool_calls += batch.non_tensor_batch.get("num_tool_calls", np.full(len(batch), None)).tolist()
            self._keep_generations(batch, seq_scores)
        return {**per_source_metrics("val", sources, scores, accs), **tool_use_metrics("val", accs, tool_calls)}

    def _keep_generations(self, batch: DataProto, seq_scores: list[float]) -> None:
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
