"""The router's load-balancing loss and the expert-load statistics of a mixture-of-experts model.

Pure torch, no model: the inputs are what the routers produced on a micro-batch.

Load-balancing loss (Fedus et al. 2022, "Switch Transformers", arXiv:2101.03961, eqs. 4-6; with
top-k routing as in Mixtral and Qwen-MoE): over ``N`` real tokens and ``E`` experts,

    loss = E * sum_e f_e * P_e,   f_e = (top-k choices of expert e) / N,   P_e = (sum_t p_{t,e}) / N,

where ``p_t = softmax(router logits of token t)``. As transformers' ``load_balancing_loss_func``
does, the tokens of every MoE layer count together (``N`` = tokens x layers), so the coefficient
of a Hugging Face config (``router_aux_loss_coef``) means the same here. ``f`` counts choices and
has no gradient; the loss is linear in every token's ``p``. That makes it exact to split the
tokens over ranks (Ulysses sequence parallelism): with ``f`` and ``N`` summed over the ranks, each
rank's part ``E * sum_e f_e * (sum of its own tokens' p_e) / N`` adds up to the loss of all tokens.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["expert_counts", "load_balancing_loss", "load_entropy"]


def expert_counts(selected: list[torch.Tensor], token_mask: torch.Tensor, num_experts: int) -> torch.Tensor:
    """How often each expert was chosen in each layer, over the real tokens.

    Args:
        selected: per MoE layer, ``[T, k]`` the chosen experts of every token.
        token_mask: ``[T]`` bool, the real tokens (padding is not counted); or ``[T]`` float, how many
            times each token counts (0 for padding; a shared prompt's token once per row of its prompt).
        num_experts: ``E``.

    Returns:
        ``[layers, E]`` float64 counts (every real token adds ``k`` times its count).
    """
    rows = []
    for chosen in selected:
        weights = token_mask.to(device=chosen.device, dtype=torch.float64)[:, None].expand(chosen.shape)
        counts = torch.bincount(chosen.flatten().long(), weights=weights.flatten(), minlength=num_experts)
        rows.append(counts[:num_experts])
    return torch.stack(rows)


def load_balancing_loss(router_logits: list[torch.Tensor], selected: list[torch.Tensor], token_mask: torch.Tensor,
                        num_experts: int, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """The Switch-Transformer load-balancing loss of one forward pass (module docstring).

    Args:
        router_logits: per MoE layer, ``[T, E]`` the router's logits of every token.
        selected: per MoE layer, ``[T, k]`` the experts each token was sent to (``f`` counts these).
        token_mask: ``[T]`` bool, the real tokens; or ``[T]`` float, how many times each token
            counts (:func:`expert_counts`): the loss of the tokens repeated that many times.
        num_experts: ``E``.
        group: ranks that hold the other tokens of the same sequences (a sequence-parallel group):
            ``f`` and ``N`` are summed over it and the result is this rank's part (module docstring);
            None: this rank holds all the tokens.

    Returns:
        a float32 scalar with a gradient through the logits.
    """
    device = router_logits[0].device
    weight = token_mask.to(device=device, dtype=torch.float32)
    counts = expert_counts(selected, token_mask, num_experts).sum(0).to(device)
    stats = torch.cat([counts, weight.sum().double().reshape(1) * len(router_logits)])
    if group is not None:
        dist.all_reduce(stats, group=group)
    tokens = stats[-1].clamp(min=1.0)
    fraction = (stats[:-1] / tokens).float()  # f_e: choices per token, sums to k
    prob_sum = sum((logits.float().softmax(-1) * weight[:, None]).sum(0) for logits in router_logits)
    return num_experts * (fraction * prob_sum).sum() / tokens.float()


def load_entropy(counts: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of each layer's expert load: ``-sum_e q_e log q_e`` with ``q`` the layer's
    counts normalised; ``log E`` when every expert gets the same share, 0 when one gets all.

    Args:
        counts: ``[layers, E]`` from :func:`expert_counts` (summed over micro-batches and ranks).

    Returns:
        ``[layers]`` float64 (0 for a layer with no tokens).
    """
    share = counts / counts.sum(-1, keepdim=True).clamp(min=1.0)
    return -torch.special.xlogy(share, share).sum(-1)
