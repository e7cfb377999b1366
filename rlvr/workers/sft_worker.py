"""The SFT trainer's worker: the actor worker, trained with the negative log-likelihood.

:class:`SFTWorker` is :class:`~rlvr.workers.engine_workers.ActorRolloutRefWorker` with
``role="actor"`` (the same model building, FSDP2 sharding, optimizer and schedule, checkpoints with
their model files, Hugging Face export) plus verl's ``TrainingWorker`` methods of an SFT run:
``train_batch`` (one optimizer step, :meth:`DataParallelPPOActor.update_sft`) and ``infer_batch``
(the loss without a step). A batch is the actor's: a conversation of ``L`` tokens is a one-token
"prompt" and an ``L - 1``-token "response", ``response_mask [B, L - 1]`` marking the tokens the loss
predicts (:func:`rlvr.trainer.data.sft_dataset` builds it).
"""

from __future__ import annotations

import torch

from rlvr.protocol import DataProto
from rlvr.single_controller.base.decorator import Dispatch, register
from rlvr.workers.collectives import all_reduce_sum
from rlvr.workers.engine_workers import ActorRolloutRefWorker

__all__ = ["SFTWorker"]


class SFTWorker(ActorRolloutRefWorker):
    """The actor worker of an SFT run.

    Args:
        config: the whole run config (an ``RlvrConfig``; the SFT trainer fills its actor section
            from the SFT config).
        chat_template: a chat template replacing the tokenizer's (``model.custom_chat_template``), so
            that checkpoints and the exported model carry the template the conversations were
            rendered with (None: the tokenizer's own).
    """

    def __init__(self, config, chat_template: str | None = None) -> None:
        super().__init__(config, role="actor")
        self.chat_template = chat_template

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """The actor's model, optimizer and schedule (see ``ActorRolloutRefWorker.init_model``)."""
        super().init_model()
        if self.chat_template is not None:
            self.tokenizer.chat_template = self.chat_template

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def train_batch(self, data: DataProto) -> DataProto:
        """One optimizer step on the batch's SFT loss and one LR-schedule step.

        ``meta_info["metrics"]``: ``train/loss`` (token-mean NLL of the whole batch over all ranks,
        before the step), ``train/grad_norm``, ``train/lr`` (of this step), ``train/skipped_steps``.
        """
        timer = self._timer()
        with timer.stage("train"):
            self.actor_placement.place(params=True, optimizer=True)
            result = self.actor.update_sft(data)
            lr = float(self.lr_scheduler.get_last_lr()[0])
            self.lr_scheduler.step()
            self._weights_version += 1
            self._rest_actor()
        metrics = {f"train/{name}": [value] for name, value in result.items()}
        metrics["train/lr"] = [lr]
        return self._reply(None, metrics, timer, "train")

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def infer_batch(self, data: DataProto) -> DataProto:
        """The SFT loss of the batch without a step: ``meta_info["metrics"]`` ``val/nll_sum`` and
        ``val/tokens`` (sums over the batch of every rank; their ratio is the token-mean loss)."""
        timer = self._timer()
        with timer.stage("infer"):
            self.actor_placement.place(params=True, optimizer=self.actor_placement.optimizer_on_device)
            data.meta_info["temperature"] = 1.0
            log_probs, _ = self.actor.compute_log_prob(data)
            mask = data.batch["response_mask"].float()
            sums = torch.tensor([float(-(log_probs * mask).sum()), float(mask.sum())], dtype=torch.float64)
            total = all_reduce_sum(sums.to(self.device), self.world_size).cpu()
            self._rest_actor()
        return self._reply(None, {"val/nll_sum": [float(total[0])], "val/tokens": [float(total[1])]}, timer, "infer")
