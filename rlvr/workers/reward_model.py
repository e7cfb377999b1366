"""``RewardModelWorker``: a discriminative reward model as a frozen-model worker group.

It reads ``reward.reward_model`` of the run config: the model (:func:`~rlvr.workers.models.load_sequence_classifier`:
a ``*ForSequenceClassification`` checkpoint with one label), the tokenizer that decodes the policy's
responses (``input_tokenizer``, default the policy's), the input limit, micro-batches and FSDP
settings. ``compute_rm_score`` builds each sample's input as verl does
(:mod:`rlvr.reward.reward_model`) and returns the classifier's output at its last token as
``rm_scores [B, R]`` (at the last valid response position). It runs colocated with the actor or on
a pool of its own (``enable_resource_pool``), on the local and the Ray backend.
"""

from __future__ import annotations

import torch

from rlvr.protocol import DataProto
from rlvr.reward.reward_model import RM_SCORES, place_rm_scores, rm_input_ids
from rlvr.single_controller.base.decorator import Dispatch, register
from rlvr.reward.rm_config import rm_max_length
from rlvr.utils.model import load_tokenizer
from rlvr.workers.frozen import FrozenModel
from rlvr.workers.frozen_worker import FrozenModelWorker
from rlvr.workers.models import load_sequence_classifier, sequence_scores

__all__ = ["RewardModelWorker"]


def _right_padded(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask) [b, longest]`` of token-id rows, right-padded."""
    longest = max(len(row) for row in rows)
    ids = torch.full((len(rows), longest), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), longest), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = 1
    return ids, mask


class RewardModelWorker(FrozenModelWorker):
    """The reward model (``reward.reward_model``).

    Args:
        config: the whole run config.
    """

    def _build(self) -> None:
        rm = self.config.reward.reward_model
        policy = self.config.actor_rollout_ref.model
        self.input_tokenizer = load_tokenizer(rm.input_tokenizer or policy.tokenizer_path or policy.path,
                                              trust_remote_code=policy.trust_remote_code)
        self.rm_tokenizer = load_tokenizer(rm.model_path, trust_remote_code=rm.trust_remote_code)
        self.max_length = rm_max_length(rm)
        module = load_sequence_classifier(rm.model_path, rm.rollout.dtype, rm.trust_remote_code).to(self.device)
        self.frozen = FrozenModel(module, world_size=self.world_size, device=self.device,
                                  param_offload=rm.fsdp_config.param_offload,
                                  reshard_after_forward=rm.fsdp_config.reshard_after_forward,
                                  micro_batch_size=rm.micro_batch_size_per_gpu, use_dynamic_bsz=rm.use_dynamic_bsz,
                                  max_token_len=rm.forward_max_token_len_per_gpu)

    @torch.no_grad()
    def _scores(self, rows: list[list[int]]) -> torch.Tensor:
        """``[len(rows)]`` classifier outputs at the last token of each row, in micro-batches."""
        frozen = self.frozen
        lengths = torch.tensor([len(row) for row in rows])
        scores = torch.zeros(len(rows))
        with frozen.on_device() as module:
            for idx in frozen.micro_batches(lengths):
                ids, mask = _right_padded([rows[i] for i in idx], self.rm_tokenizer.pad_token_id)
                scores[torch.tensor(idx, dtype=torch.long)] = sequence_scores(
                    module, ids.to(self.device), mask.to(self.device)).cpu()
        return scores

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_rm_score(self, data: DataProto) -> DataProto:
        """``rm_scores [B, R]``: the reward model's score of each sample at its last valid response
        position (float32). Metrics: ``reward_model/input_length`` (tokens per input, mean)."""
        self._require_built("compute_rm_score")
        timer = self._timer()
        with timer.stage("reward_model"):
            rows = rm_input_ids(data, self.input_tokenizer, self.rm_tokenizer, self.max_length) if len(data) else []
            scores = self._scores(rows) if rows else torch.zeros(0)
        lengths = [float(len(row)) for row in rows]
        return self._reply({RM_SCORES: place_rm_scores(data, scores)}, {"reward_model/input_length": lengths},
                           timer, "reward_model")
