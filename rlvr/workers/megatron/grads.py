"""Finishing the gradients of a Megatron stage and clipping their global norm (rlvr's update loop).

After the micro-batches of a mini-batch have been accumulated, :func:`clip_grad_norm` (the
``clip_grad_norm_fn`` of the update loop in :mod:`rlvr.workers.ppo_update`):

1. averages the gradients over the data-parallel ranks (what FSDP2's reduce-scatter does), after
   summing them over the context-parallel ranks (each holds the gradient of its own tokens); an
   expert's gradient already holds the tokens its expert-parallel peers sent it, so it is summed over
   the ranks that hold the same expert (expert data parallel) and divided by the data-parallel size,
   as megatron-core's own data parallelism does;
2. with tied embeddings over several pipeline stages, sums the gradient of the embedding (first
   stage) and of its copy in the LM head (last stage), so both copies take the same step;
3. computes the global norm over all ranks, counting every weight once: tensor-parallel slices on
   every rank, replicated weights (norms, the value head, LoRA's replicated ``A``/``B``) on
   tensor-parallel rank 0 only, the tied
   head's copy not at all, each expert's slices on the ranks of one expert-data-parallel copy;
4. scales the gradients by ``min(1, max_norm / (norm + 1e-6))``, like ``torch.nn.utils.clip_grad_norm_``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from rlvr.workers.megatron.lora import lora_rules
from rlvr.workers.megatron.model import MegatronStage

__all__ = ["clip_grad_norm"]

TIED_HEAD = "gpt.output_layer.weight"
EMBEDDING = "gpt.embedding.word_embeddings.weight"


def _average_over_data_parallel(grads: list[torch.Tensor], dp: int, group) -> None:
    """Sum ``grads`` over ``group`` (None: this rank alone) and divide by ``dp``."""
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    if group is not None:
        dist.all_reduce(flat, group=group)
    flat /= dp
    offset = 0
    for grad in grads:
        grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
        offset += grad.numel()


def clip_grad_norm(model: MegatronStage, max_norm: float) -> float:
    """Finish the accumulated gradients (steps 1-2 of the module docstring) and clip their global
    norm to ``max_norm``; returns the norm before clipping (``inf``/``nan`` when not finite, then
    nothing is clipped). A collective over every rank of the model."""
    p = model.parallel
    named = [(name, param.grad) for name, param in model.named_parameters() if param.grad is not None]
    rules = {**model.rules, **lora_rules(model)}  # frozen weights have no gradient; adapters do
    is_expert = {name: rules[name].expert is not None for name, _ in named}
    if p.dp_cp_group is not None:  # summed over context-parallel peers, averaged over data-parallel ones
        _average_over_data_parallel([g for n, g in named if not is_expert[n]], p.dp, p.dp_cp_group)
    if p.dp_group is not None:  # experts: summed over the ranks holding the same ones, divided by dp
        _average_over_data_parallel([g for n, g in named if is_expert[n]], p.dp, p.edp_group)
    tied_copy = model.shape.tied and p.pp > 1
    if tied_copy and p.embedding_group is not None:
        for name, grad in named:
            if name in (EMBEDDING, TIED_HEAD):
                dist.all_reduce(grad, group=p.embedding_group)
    squares = torch.zeros((), dtype=torch.float64, device=model.inv_freq.device)
    expert_squares = torch.zeros((), dtype=torch.float64, device=model.inv_freq.device)
    for name, grad in named:
        if is_expert[name]:
            expert_squares += grad.double().square().sum()
        elif (rules[name].tensor_parallel or p.tp_rank == 0) and not (tied_copy and name == TIED_HEAD):
            squares += grad.double().square().sum()
    if p.mp_group is not None:
        dist.all_reduce(squares, group=p.mp_group)
    if p.expert_mp_group is not None:
        dist.all_reduce(expert_squares, group=p.expert_mp_group)
    norm = float((squares + expert_squares).sqrt())
    if torch.isfinite(torch.tensor(norm)):
        scale = min(1.0, max_norm / (norm + 1e-6))
        if scale < 1.0:
            for _, grad in named:
                grad.mul_(scale)
    return norm
