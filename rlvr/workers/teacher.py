"""``TeacherWorker``: the distillation teacher as a frozen-model worker group.

The teacher is a frozen causal LM of any size that shares the student's tokenizer (checked when it
starts: :func:`check_teacher_tokenizer`). It reads the student's
own samples with the reference policy's code (:func:`~rlvr.workers.frozen.frozen_policy`) at
temperature 1 (the untempered distribution, as verl's teacher), and returns what the distillation
loss needs (:mod:`rlvr.trainer.ppo.distillation`):

- a KL-estimator loss: ``teacher_log_probs [B, R]``, the log-prob of each sampled token;
- a top-k loss: ``teacher_topk_log_probs`` and ``teacher_topk_ids [B, R, K]``, its ``K`` most
  likely next tokens at each response position, among the ids the student's vocabulary has.

It runs colocated with the actor or on a pool of its own (``distillation.nnodes > 0``).
"""

from __future__ import annotations

import torch
from omegaconf import OmegaConf

from rlvr.protocol import DataProto
from rlvr.single_controller.base.decorator import Dispatch, register
from rlvr.trainer.ppo.distillation_config import teacher_config
from rlvr.trainer.ppo.distillation import (
    TEACHER_LOG_PROBS,
    TEACHER_TOPK_IDS,
    TEACHER_TOPK_LOG_PROBS,
    get_distillation_loss,
)
from rlvr.utils.errors import ConfigError
from rlvr.utils.model import load_tokenizer
from rlvr.workers.actor.dp_actor import response_logits
from rlvr.workers.frozen import frozen_policy
from rlvr.workers.frozen_worker import FrozenModelWorker
from rlvr.workers.models import build_causal_lm

__all__ = ["TeacherWorker", "teacher_topk", "check_teacher_tokenizer"]

_FORWARD_KEYS = ("input_ids", "attention_mask", "position_ids", "responses")


def check_teacher_tokenizer(cfg) -> None:
    """The teacher must tokenize as the student does: it scores the student's token ids (any size
    of model is fine). Loads both tokenizers.

    Raises:
        ConfigError: another vocabulary, naming both models and what to do.
    """
    student_model = cfg.actor_rollout_ref.model
    student = student_model.tokenizer_path or student_model.path
    teacher = teacher_config(cfg)
    if teacher.model_path == student:
        return
    ours = load_tokenizer(student, trust_remote_code=student_model.trust_remote_code).get_vocab()
    theirs = load_tokenizer(teacher.model_path, trust_remote_code=teacher.trust_remote_code).get_vocab()
    if ours != theirs:
        differ = sorted(set(theirs.items()) ^ set(ours.items()))[:3]
        raise ConfigError("distillation.teacher_models.teacher_model.model_path",
                          f"the teacher {teacher.model_path!r} tokenizes differently from the student {student!r} "
                          f"({len(theirs)} vs {len(ours)} tokens; e.g. {differ}): it would score other tokens than "
                          "the student sampled. Pick a teacher of the student's model family (same tokenizer, any size)")


@torch.no_grad()
def teacher_topk(module: torch.nn.Module, batch: dict[str, torch.Tensor], k: int, vocab_limit: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` most likely next tokens at every response position under the untempered teacher.

    Args:
        module: the teacher (a causal LM).
        batch: ``input_ids``/``attention_mask``/``position_ids [b, P+R]``, ``responses [b, R]``.
        k: tokens per position.
        vocab_limit: only ids below it are candidates (the student's vocabulary); the log-probs are
            still normalised over the teacher's whole vocabulary.

    Returns:
        ``(log_probs [b, R, k] float32, ids [b, R, k] int64)``, 0 past the last response column.
    """
    response_len = batch["responses"].shape[1]
    log_softmax = response_logits(module, batch, 1.0).float().log_softmax(-1)
    if vocab_limit < log_softmax.shape[-1]:
        log_softmax[..., vocab_limit:] = float("-inf")
    values, ids = log_softmax.topk(k, dim=-1)
    pad = (0, 0, 0, response_len - values.shape[1])
    return torch.nn.functional.pad(values, pad), torch.nn.functional.pad(ids, pad)


class TeacherWorker(FrozenModelWorker):
    """The teacher of ``distillation.teacher_models.teacher_model``.

    Args:
        config: the whole run config.
    """

    def _build(self) -> None:
        cfg = self.config
        check_teacher_tokenizer(cfg)
        teacher, student = teacher_config(cfg), cfg.actor_rollout_ref.model
        self.loss_config = cfg.distillation.distillation_loss
        self.uses_topk = get_distillation_loss(self.loss_config.loss_mode)[1].uses_topk
        self.vocab_limit = len(load_tokenizer(student.tokenizer_path or student.path,
                                              trust_remote_code=student.trust_remote_code))
        model_config = OmegaConf.merge(student, {"path": teacher.model_path, "tokenizer_path": None,
                                                 "dtype": teacher.inference.dtype, "lora_rank": 0,
                                                 "trust_remote_code": teacher.trust_remote_code})
        module = build_causal_lm(model_config, trainable=False).to(self.device)
        self.frozen, self.reader = frozen_policy(
            module, cfg.actor_rollout_ref.actor, world_size=self.world_size, device=self.device,
            fsdp_config=teacher.fsdp_config, micro_batch_size=teacher.log_prob_micro_batch_size_per_gpu,
            use_dynamic_bsz=teacher.use_dynamic_bsz, max_token_len=teacher.max_token_len_per_gpu,
            use_remove_padding=student.use_remove_padding and not self.uses_topk, sp_size=1)

    def _topk(self, data: DataProto) -> dict[str, torch.Tensor]:
        batch = {key: data.batch[key] for key in _FORWARD_KEYS}
        rows, response_len = batch["responses"].shape
        k = int(self.loss_config.topk)
        log_probs = torch.zeros(rows, response_len, k)
        ids = torch.zeros(rows, response_len, k, dtype=torch.long)
        with self.frozen.on_device() as module:
            for idx in self.frozen.micro_batches(batch["attention_mask"].sum(-1)):
                index = torch.tensor(idx, dtype=torch.long)
                micro = {key: value[index].to(self.device) for key, value in batch.items()}
                values, top = teacher_topk(module, micro, k, self.vocab_limit)
                log_probs[index], ids[index] = values.cpu(), top.cpu()
        return {TEACHER_TOPK_LOG_PROBS: log_probs, TEACHER_TOPK_IDS: ids}

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_teacher_log_prob(self, data: DataProto) -> DataProto:
        """The teacher's scores of the student's samples (see the module docstring). Metrics:
        ``distillation/teacher_log_prob`` (mean log-prob of the sampled tokens, KL-estimator losses)."""
        self._require_built("compute_teacher_log_prob")
        timer = self._timer()
        with timer.stage("teacher"):
            if self.uses_topk:
                tensors, metrics = self._topk(data), {}
            else:
                untempered = DataProto(batch=data.batch, non_tensor_batch=data.non_tensor_batch,
                                       meta_info={**data.meta_info, "temperature": 1.0})
                with self.frozen.on_device():
                    log_probs, _ = self.reader.compute_log_prob(untempered)
                mask = data.batch["response_mask"].bool()
                tensors = {TEACHER_LOG_PROBS: log_probs}
                metrics = {"distillation/teacher_log_prob": [float(log_probs[mask].mean())] if mask.any() else []}
        return self._reply(tensors, metrics, timer, "teacher")
