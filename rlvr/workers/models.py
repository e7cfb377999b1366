"""Building the workers' models: the policy (a causal LM, optionally with LoRA adapters) and the
critic (the LM's backbone with a scalar value head).

Models load through :func:`rlvr.utils.model.load_causal_lm` (hub id, local folder or GGUF file).
LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models") goes through peft:
the base weights are frozen and only the adapters train; with adapters disabled the same module
is the frozen base model, which the reference policy reuses. The critic's tokenizer must have the
policy's vocabulary (:func:`critic_tokenizer`).
"""

from __future__ import annotations

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from rlvr.utils.errors import ConfigError
from rlvr.utils.model import load_causal_lm, load_tokenizer
from rlvr.workers.packed_attention import use_packed_attention

__all__ = ["torch_dtype", "build_causal_lm", "CriticModel", "build_critic", "critic_tokenizer", "unwrap_hf_model"]

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


def torch_dtype(name: str) -> torch.dtype:
    """``"float32"``/``"bfloat16"`` (or fp32/bf16) -> torch dtype."""
    if name not in _DTYPES:
        raise ValueError(f"model.dtype must be one of {sorted(_DTYPES)}, got {name!r}")
    return _DTYPES[name]


def _lora_config(model_config, task_type: str | None) -> LoraConfig:
    targets = model_config.target_modules
    return LoraConfig(
        r=int(model_config.lora_rank),
        lora_alpha=int(model_config.lora_alpha),
        lora_dropout=float(model_config.lora_dropout),
        target_modules=targets if isinstance(targets, str) else list(targets),
        task_type=task_type,
        bias="none",
    )


def _enable_gradient_checkpointing(model: PreTrainedModel) -> None:
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})


def _load(model_config, path: str) -> PreTrainedModel:
    """The causal LM at ``path`` with the section's dtype, attention and config overrides
    (``override_config``); on the packed-sequence attention (over that one) when ``use_remove_padding``."""
    model = load_causal_lm(
        path,
        dtype=torch_dtype(model_config.dtype),
        attn_implementation=model_config.attn_implementation,
        trust_remote_code=model_config.trust_remote_code,
        config_overrides=model_config.override_config,
    )
    if model_config.use_remove_padding:
        use_packed_attention(model)
    return model


def build_causal_lm(model_config, trainable: bool) -> nn.Module:
    """The policy model from ``actor_rollout_ref.model`` (path, dtype, attention, packing, LoRA, checkpointing).

    Args:
        model_config: the ``ModelConfig`` section.
        trainable: False for a frozen reference model (no LoRA, no checkpointing, eval mode,
            ``requires_grad=False``).

    Returns:
        a ``PreTrainedModel``, or a ``PeftModel`` when ``lora_rank > 0`` and ``trainable``.
    """
    model = _load(model_config, model_config.path)
    if not trainable:
        model.requires_grad_(False)
        return model.eval()
    if model_config.enable_gradient_checkpointing:
        _enable_gradient_checkpointing(model)
    if model_config.lora_rank > 0:
        if model_config.enable_gradient_checkpointing:
            model.enable_input_require_grads()
        model = get_peft_model(model, _lora_config(model_config, "CAUSAL_LM"))
    return model


def unwrap_hf_model(module: nn.Module) -> PreTrainedModel:
    """The Hugging Face model inside a (peft-wrapped) policy model."""
    if isinstance(module, PeftModel):
        return module.get_base_model()
    if isinstance(module, PreTrainedModel):
        return module
    raise TypeError(f"expected a PreTrainedModel or PeftModel, got {type(module).__name__}")


class CriticModel(nn.Module):
    """A value model: the LM's backbone (no LM head) and a linear head to one scalar per token.

    Args:
        backbone: the base transformer (``lm.base_model``), returning ``last_hidden_state``.
        hidden_size: width of the hidden states.
    """

    def __init__(self, backbone: nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.value_head = nn.Linear(hidden_size, 1)
        nn.init.normal_(self.value_head.weight, std=1.0 / (hidden_size + 1))
        nn.init.zeros_(self.value_head.bias)
        self.value_head.to(next(backbone.parameters()).dtype)

    @property
    def config(self):
        """The backbone's transformers config (what the model is)."""
        return self.backbone.config

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                position_ids: torch.Tensor, **model_kwargs) -> torch.Tensor:
        """Values of every position.

        Args:
            input_ids: ``[batch, seq_len]``.
            attention_mask: ``[batch, seq_len]``, or None for a packed row, whose boundaries come in
                ``model_kwargs``.
            position_ids: ``[batch, seq_len]`` (``[3, batch, seq_len]`` for an M-RoPE model with images).
            model_kwargs: further arguments of the backbone's forward: the packed rows' boundaries, or
                the images of a vision-language backbone (``pixel_values``, ...;
                :func:`rlvr.utils.multimodal.model_inputs`).

        Returns:
            ``[batch, seq_len]`` float32 values.
        """
        hidden = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False,
            **model_kwargs,
        ).last_hidden_state
        return self.value_head(hidden).squeeze(-1).float()


def build_critic(model_config, path: str) -> CriticModel:
    """The critic from the ``critic.model`` section: backbone of the LM at ``path`` + value head.

    With ``lora_rank > 0`` the backbone gets LoRA adapters (the value head always trains).
    """
    lm = _load(model_config, path)
    backbone = lm.base_model
    if model_config.enable_gradient_checkpointing:
        _enable_gradient_checkpointing(backbone)
    if model_config.lora_rank > 0:
        if model_config.enable_gradient_checkpointing:
            backbone.enable_input_require_grads()
        backbone = get_peft_model(backbone, _lora_config(model_config, "FEATURE_EXTRACTION"))
    return CriticModel(backbone, lm.config.get_text_config().hidden_size)


def critic_tokenizer(config) -> PreTrainedTokenizerBase:
    """The critic's tokenizer, ``critic.model.tokenizer_path`` (None: the policy's tokenizer).

    The critic scores the token ids the policy sampled, so a tokenizer of its own must map text to
    the same ids as the policy's: one with another vocabulary raises :class:`ConfigError`.

    Args:
        config: the whole run config.
    """
    policy = config.actor_rollout_ref.model
    policy_path = policy.tokenizer_path or policy.path
    path = config.critic.model.tokenizer_path or policy_path
    tokenizer = load_tokenizer(path, trust_remote_code=config.critic.model.trust_remote_code)
    if path != policy_path and tokenizer.get_vocab() != load_tokenizer(
            policy_path, trust_remote_code=policy.trust_remote_code).get_vocab():
        raise ConfigError("critic.model.tokenizer_path",
                          f"the tokenizer at {path!r} has another vocabulary than the policy's ({policy_path!r}); "
                          "the critic reads the policy's token ids, so give it a tokenizer with the same "
                          "vocabulary, or leave the key unset (the policy's tokenizer)")
    return tokenizer
