"""Building the workers' models: the policy (a causal LM, optionally with LoRA adapters) and the
critic (the LM's backbone with a scalar value head).

Models load through :func:`rlvr.utils.model.load_causal_lm` (hub id, local folder or GGUF file).
LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models") goes through peft:
the base weights are frozen and only the adapters train; with adapters disabled the same module
is the frozen base model, which the reference policy reuses. The critic's tokenizer must have the
policy's vocabulary (:func:`critic_tokenizer`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors import safe_open
from torch import nn
from transformers import AutoConfig, AutoModelForSequenceClassification, PreTrainedModel, PreTrainedTokenizerBase

from rlvr.utils.errors import ConfigError
from rlvr.utils.model import load_causal_lm, load_tokenizer, local_model_dir
from rlvr.workers.packed_attention import use_packed_attention

__all__ = ["torch_dtype", "build_causal_lm", "CriticModel", "build_critic", "critic_tokenizer", "unwrap_hf_model",
           "check_sequence_classifier", "load_sequence_classifier", "sequence_scores"]

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
        exclude_modules=_exclude(model_config.exclude_modules),
    )


def _exclude(value: Any) -> Any:
    """``model.exclude_modules``: a regex string, a list of names, or None."""
    return value if value is None or isinstance(value, str) else list(value)


def _enable_gradient_checkpointing(model: PreTrainedModel) -> None:
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})


def _load(model_config, path: str, dtype: str | None = None) -> PreTrainedModel:
    """The causal LM at ``path`` with the section's dtype (or ``dtype``: a role's
    ``fsdp_config.model_dtype``), attention and config overrides (``model.override_config``); on
    the packed-sequence attention (over that one) when ``use_remove_padding``."""
    model = load_causal_lm(
        path,
        dtype=torch_dtype(dtype or model_config.dtype),
        attn_implementation=model_config.attn_implementation,
        trust_remote_code=model_config.trust_remote_code,
        **dict(model_config.override_config),
    )
    if model_config.use_remove_padding:
        use_packed_attention(model)
    return model


def build_causal_lm(model_config, trainable: bool, dtype: str | None = None, freeze_vision: bool = False) -> nn.Module:
    """The policy model from ``actor_rollout_ref.model`` (path, dtype, attention, packing, LoRA, checkpointing).

    Args:
        model_config: the ``ModelConfig`` section.
        trainable: False for a frozen reference model (no LoRA, no checkpointing, eval mode,
            ``requires_grad=False``).
        dtype: the parameters' dtype (a role's ``fsdp_config.model_dtype``; None: ``model.dtype``).
        freeze_vision: a vision-language model's vision encoder does not train
            (``actor.freeze_vision_tower``).

    Returns:
        a ``PreTrainedModel``, or a ``PeftModel`` when ``lora_rank > 0`` and ``trainable``.
    """
    model = _load(model_config, model_config.path, dtype)
    if not trainable:
        model.requires_grad_(False)
        return model.eval()
    if freeze_vision:
        vision_encoder(model).requires_grad_(False)
    if model_config.enable_gradient_checkpointing:
        _enable_gradient_checkpointing(model)
    if model_config.lora_rank > 0:
        if model_config.enable_gradient_checkpointing:
            model.enable_input_require_grads()
        model = get_peft_model(model, _lora_config(model_config, "CAUSAL_LM"))
    return model


VISION_ENCODER_NAMES = ("visual", "vision_tower", "vision_model")
"""Attribute names of the vision encoder in transformers' vision-language models."""


def vision_encoder(model: PreTrainedModel) -> nn.Module:
    """The vision encoder of a vision-language model.

    Raises:
        ValueError: the model has none (a text-only model).
    """
    for name, module in model.named_modules():
        if name.rpartition(".")[2] in VISION_ENCODER_NAMES:
            return module
    raise ValueError(f"{type(model).__name__} has no vision encoder (none of {VISION_ENCODER_NAMES}); "
                     "actor.freeze_vision_tower applies to vision-language models only")


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


def build_critic(model_config, path: str, dtype: str | None = None) -> CriticModel:
    """The critic from the ``critic.model`` section: backbone of the LM at ``path`` + value head
    (``dtype``: ``critic.fsdp_config.model_dtype``; None: ``critic.model.dtype``).

    With ``lora_rank > 0`` the backbone gets LoRA adapters (the value head always trains).
    """
    lm = _load(model_config, path, dtype)
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


def _stored_weight_names(folder: str) -> set[str] | None:
    """The tensor names of a local checkpoint's safetensors files (read from their headers), or
    None when the folder has none (a hub id, ``.bin`` weights)."""
    root = Path(folder)
    files = sorted(root.glob("*.safetensors")) if root.is_dir() else []
    if not files:
        return None
    names: set[str] = set()
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            names.update(handle.keys())
    return names


def check_sequence_classifier(path: str, trust_remote_code: bool = False,
                              key: str = "reward.reward_model.model_path") -> str:
    """Check, without loading it, that ``path`` holds a reward model: a ``*ForSequenceClassification``
    checkpoint with ``num_labels=1`` whose stored weights (when they are local safetensors files)
    include the ``score`` head; returns the folder (or hub id) to load.

    Raises:
        ConfigError: which of the three it is not, and what to do.
    """
    source = local_model_dir(path)
    config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code)
    architectures = list(config.architectures or [])
    if not any(name.endswith("ForSequenceClassification") for name in architectures):
        raise ConfigError(key, f"{path!r} is a {', '.join(architectures) or config.model_type} checkpoint, not a "
                          "sequence-classification model; a reward model is a *ForSequenceClassification checkpoint "
                          "with num_labels=1 (train one with `python -m rlvr.trainer.rm_trainer`)")
    if config.num_labels != 1:
        raise ConfigError(key, f"{path!r} has num_labels={config.num_labels}; rlvr reads one scalar reward per "
                          "sample, so the reward model must have num_labels=1")
    stored = _stored_weight_names(source)
    if stored is not None and "score.weight" not in stored:
        raise ConfigError(key, f"{path!r} has no trained score head (its weights lack score.weight: transformers "
                          "would start it at random); give a trained reward model")
    return source


def load_sequence_classifier(path: str, dtype: str = "float32", trust_remote_code: bool = False,
                             key: str = "reward.reward_model.model_path") -> PreTrainedModel:
    """A reward model (see :func:`check_sequence_classifier`) with its ``score`` head: a bias-free
    linear layer to one output on the last hidden states, as transformers' decoder classifiers have.

    Args:
        path: folder or hub id (a GGUF file holds a causal LM, never a classifier).
        dtype: ``float32`` or ``bfloat16``.
        key: the config key that named ``path``, for errors.

    Raises:
        ConfigError: not a one-label sequence classifier, or no (trained) ``score`` head; the message
            says which and what to do.
    """
    source = check_sequence_classifier(path, trust_remote_code, key)
    model, info = AutoModelForSequenceClassification.from_pretrained(
        source, dtype=torch_dtype(dtype), trust_remote_code=trust_remote_code, output_loading_info=True)
    head = getattr(model, "score", None)
    if not isinstance(head, nn.Linear) or head.out_features != 1:
        raise ConfigError(key, f"{path!r} ({type(model).__name__}) has no `score` head (a linear layer to one "
                          "output on the last hidden states), which rlvr reads the reward from; use a decoder "
                          "classifier such as LlamaForSequenceClassification or Qwen2ForSequenceClassification")
    missing = [name for name in info["missing_keys"] if name.startswith("score.")]
    if missing:
        raise ConfigError(key, f"{path!r} has no trained score head (its weights lack {', '.join(missing)}: "
                          "transformers would start it at random); give a trained reward model")
    return model.eval()


def sequence_scores(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The classifier's output at the last real token of each right-padded row.

    The ``score`` head's output is read at every position (a forward hook) and picked at
    ``attention_mask.sum(-1) - 1``, so the result does not depend on the pad id (transformers pools
    at the last token that is not the pad token, which for a model whose pad token is also a real
    token would pick another position).

    Args:
        model: a :func:`load_sequence_classifier` model (plain or FSDP2-sharded).
        input_ids, attention_mask: ``[b, T]``, right-padded.

    Returns:
        ``[b]`` float32 scores.
    """
    captured: list[torch.Tensor] = []
    handle = model.score.register_forward_hook(lambda _module, _inputs, output: captured.append(output))
    try:
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
    finally:
        handle.remove()
    last = attention_mask.sum(-1) - 1
    return captured[0][torch.arange(input_ids.shape[0], device=input_ids.device), last, 0].float()
