"""``RewardModelTrainingWorker``: trains a reward model on preference pairs (the RM trainer's worker).

The model is the base causal LM's backbone with a one-output ``score`` head (transformers'
``AutoModelForSequenceClassification``, ``num_labels=1``), FSDP2-sharded over the worker group like
the actor, trained with the actor's optimizer, schedule and update loop
(:func:`~rlvr.workers.ppo_update.update_mini_batch`: micro-batches, gradient accumulation, the
clipped optimizer step) on the Bradley-Terry loss (Bradley & Terry 1952; as in Ouyang et al. 2022,
"Training language models to follow instructions with human feedback", arXiv:2203.02155)::

    loss = -mean log sigmoid(r(chosen) - r(rejected))

where ``r`` is the score head's output at the last token of the pair's reward-model input
(:func:`~rlvr.workers.models.sequence_scores`, the same read as the reward-model worker's). It is
exported as a Hugging Face folder that ``reward.reward_model.model_path`` loads.

Batch keys (``[pairs, L]``, right-padded): ``chosen_input_ids``, ``chosen_attention_mask``,
``rejected_input_ids``, ``rejected_attention_mask``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AutoModelForSequenceClassification

from rlvr.protocol import DataProto
from rlvr.single_controller.base.decorator import Dispatch, register
from rlvr.utils.model import load_tokenizer, local_model_dir
from rlvr.workers.checkpoint import export_hf_model
from rlvr.workers.engine_workers import TrainingWorker
from rlvr.workers.fsdp import shard_module
from rlvr.workers.models import sequence_scores, torch_dtype
from rlvr.workers.optimizer import build_lr_scheduler, build_optimizer
from rlvr.workers.ppo_update import update_mini_batch

__all__ = ["RewardModelTrainingWorker", "PAIR_KEYS", "bradley_terry_loss"]

PAIR_KEYS = ("chosen_input_ids", "chosen_attention_mask", "rejected_input_ids", "rejected_attention_mask")
_METRICS = ("rm/loss", "rm/pair_accuracy", "rm/margin")


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """``-mean log sigmoid(chosen - rejected)`` over ``[pairs]`` scores (a 0-dim tensor)."""
    return -F.logsigmoid(chosen - rejected).mean()


class RewardModelTrainingWorker(TrainingWorker):
    """Holds the reward model being trained.

    Args:
        config: the whole run config (threads, seed, backend, timeouts).
        rm_config: the RM trainer's section (:class:`~rlvr.trainer.rm_trainer.RMTrainerConfig`):
            base model, dtype, optimizer, micro-batch size.
    """

    def __init__(self, config, rm_config) -> None:
        super().__init__(config)
        self.rm_config = rm_config
        self.module = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Load the base model with a fresh one-output score head (the same on every rank: seeded),
        shard it and build its optimizer and schedule."""
        self._setup()
        cfg = self.rm_config
        self.tokenizer = load_tokenizer(cfg.model_path)
        module = AutoModelForSequenceClassification.from_pretrained(
            local_model_dir(cfg.model_path), num_labels=1, dtype=torch_dtype(cfg.dtype),
            pad_token_id=self.tokenizer.pad_token_id).to(self.device)
        self.module = shard_module(module, self.world_size, self._device_type(), True)
        self.optimizer = build_optimizer(self.module, cfg.optim)
        self.lr_scheduler = build_lr_scheduler(self.optimizer, cfg.optim)

    def _pair_scores(self, micro: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(chosen, rejected)`` scores ``[b]`` of a micro-batch, in one forward of ``2b`` rows."""
        length = max(micro["chosen_input_ids"].shape[1], micro["rejected_input_ids"].shape[1])
        pad = self.tokenizer.pad_token_id
        ids = torch.cat([F.pad(micro[f"{side}_input_ids"], (0, length - micro[f"{side}_input_ids"].shape[1]), value=pad)
                         for side in ("chosen", "rejected")])
        mask = torch.cat([F.pad(micro[f"{side}_attention_mask"], (0, length - micro[f"{side}_attention_mask"].shape[1]))
                          for side in ("chosen", "rejected")])
        scores = sequence_scores(self.module, ids, mask)
        return scores.chunk(2)

    def _micro_loss(self, micro: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        chosen, rejected = self._pair_scores(micro)
        loss = bradley_terry_loss(chosen, rejected)
        margin = (chosen - rejected).detach()
        return loss, torch.stack([loss.detach(), (margin > 0).float().mean(), margin.mean()]).float().cpu()

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def train_step(self, data: DataProto) -> DataProto:
        """One optimizer step on this rank's pairs (micro-batches of ``micro_batch_size``); one
        schedule step. Metrics: ``rm/loss``, ``rm/pair_accuracy``, ``rm/margin`` (means over all
        ranks' pairs), ``rm/grad_norm``, ``rm/lr``."""
        timer = self._timer()
        with timer.stage("update_rm"):
            self.module.train()
            mini = {key: data.batch[key] for key in PAIR_KEYS}
            rows = mini["chosen_input_ids"].shape[0]
            mini["response_mask"] = torch.ones(rows, 1)  # one "sequence" per pair: the update weighs pairs alike
            size = int(self.rm_config.micro_batch_size)
            micro_batches = [list(range(start, min(start + size, rows))) for start in range(0, rows, size)]
            update = update_mini_batch(self.module, self.optimizer, mini, micro_batches, self._micro_loss, len(_METRICS),
                                       loss_agg_mode="seq-mean-token-mean", grad_clip=float(self.rm_config.grad_clip),
                                       world_size=self.world_size, device=self.device)
            metrics = {name: float(value) for name, value in zip(_METRICS, update.metric_sums)}
            metrics.update({"rm/grad_norm": update.grad_norm, "rm/lr": float(self.lr_scheduler.get_last_lr()[0])})
            self.lr_scheduler.step()
        return self._reply(None, metrics, timer, "update_rm")

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    @torch.no_grad()
    def score_pairs(self, data: DataProto) -> DataProto:
        """``chosen_scores``, ``rejected_scores [pairs]`` under the current model."""
        self.module.eval()
        batch = {key: data.batch[key].to(self.device) for key in PAIR_KEYS}
        rows, size = batch["chosen_input_ids"].shape[0], int(self.rm_config.micro_batch_size)
        chosen, rejected = torch.zeros(rows), torch.zeros(rows)
        for start in range(0, rows, size):
            part = {key: value[start:start + size] for key, value in batch.items()}
            chosen[start:start + size], rejected[start:start + size] = (s.cpu() for s in self._pair_scores(part))
        return DataProto.from_dict(tensors={"chosen_scores": chosen, "rejected_scores": rejected})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def export(self, path: str) -> None:
        """Write the reward model and its tokenizer as a Hugging Face folder at ``path``."""
        export_hf_model(path, self.module, self.tokenizer, self.rank, self.world_size,
                        auto_cls=AutoModelForSequenceClassification)
