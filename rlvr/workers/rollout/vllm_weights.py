"""The actor's weights in the form a vLLM engine loads: Hugging Face checkpoint names, LoRA merged,
tied weights under every name.

vLLM loads checkpoint-format weights (``reload_weights(..., is_checkpoint_format=True)``) by their
Hugging Face names and repacks them into its own layout. Two details matter: a tied LM head must be
sent as ``lm_head.weight`` too (vLLM keeps a separate packed copy, which would otherwise stay
stale), and a peft policy's adapters are folded into the base weights (``W + scale * B @ A``).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from peft import PeftModel
from torch import nn

from rlvr.workers.checkpoint import merge_lora
from rlvr.workers.models import unwrap_hf_model
from rlvr.workers.rollout.base import Weights, as_named_tensors

__all__ = ["PolicyWeightNames"]

_PEFT_PREFIX = "base_model.model."


class PolicyWeightNames:
    """How the policy's parameters map to checkpoint names.

    Args:
        module: the policy model (a transformers model or a peft model around one).
    """

    def __init__(self, module: nn.Module) -> None:
        self.hf_config = unwrap_hf_model(module).config
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
        merged (this needs all of them at once), each shared tensor under all of its names."""
        named = as_named_tensors(weights)
        if self.peft_module is not None:
            named = merge_lora(dict(named), self.peft_module).items()
        for name, tensor in named:
            plain = self._plain(name)
            yield plain, tensor
            for alias in self.aliases.get(plain, ()):
                yield alias, tensor
