"""Utils for tokenization: ``hf_tokenizer`` and ``hf_processor``."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from transformers import AutoProcessor, AutoTokenizer, PreTrainedTokenizerBase, ProcessorMixin

from rlvr.utils.model import local_model_dir, resolve_model_path
from rlvr.utils.processor import load_processor

__all__ = ["hf_tokenizer", "hf_processor", "set_pad_token_id", "set_chat_template", "data_tokenizer"]

GEMMA2_NAME = "gemma-2-2b-it"
GEMMA2_EOS_TOKEN = "<end_of_turn>"
GEMMA2_EOS_TOKEN_ID = 107


def set_pad_token_id(tokenizer: PreTrainedTokenizerBase) -> None:
    """Use the EOS token as padding when the tokenizer has no pad token (warns)."""
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token is None:
            raise ValueError(
                f"tokenizer {tokenizer.name_or_path} has neither a pad nor an EOS token; "
                "set tokenizer.pad_token explicitly"
            )
        tokenizer.pad_token = tokenizer.eos_token
        warnings.warn(
            f"tokenizer.pad_token_id is None; set to the EOS token {tokenizer.eos_token!r} "
            f"(id {tokenizer.eos_token_id})",
            stacklevel=3,
        )


def hf_tokenizer(
    name_or_path: str | os.PathLike,
    correct_pad_token: bool = True,
    correct_gemma2: bool = True,
    **kwargs,
) -> PreTrainedTokenizerBase:
    """Create a huggingface pretrained tokenizer which correctly handles eos and pad tokens.

    ``name_or_path`` goes through :func:`rlvr.utils.model.resolve_model_path`, so the embedded
    default ``"smollm2-135m-instruct"``, a GGUF file, a local folder or a hub id all work.

    Args:
        name_or_path: the name of the tokenizer (model alias, hub id, folder or GGUF file).
        correct_pad_token: whether to correct the pad token id (pad := EOS when missing, warns).
        correct_gemma2: whether to correct the gemma2 tokenizer: for ``gemma-2-2b-it`` the EOS
            token becomes ``<end_of_turn>`` (id 107), the token that ends a chat turn (warns).
        **kwargs: passed to ``AutoTokenizer.from_pretrained`` (e.g. ``trust_remote_code``).

    Returns:
        transformers.PreTrainedTokenizer: the pretrained tokenizer.
    """
    if correct_gemma2 and GEMMA2_NAME in os.fspath(name_or_path):
        warnings.warn(
            f"found '{GEMMA2_NAME}' in the tokenizer name; setting its EOS token to {GEMMA2_EOS_TOKEN!r} "
            f"(id {GEMMA2_EOS_TOKEN_ID}) so generation stops at the end of a chat turn",
            stacklevel=2,
        )
        kwargs["eos_token"] = GEMMA2_EOS_TOKEN
    tokenizer = AutoTokenizer.from_pretrained(local_model_dir(name_or_path), **kwargs)
    if correct_gemma2 and GEMMA2_NAME in os.fspath(name_or_path) and tokenizer.eos_token_id != GEMMA2_EOS_TOKEN_ID:
        raise ValueError(
            f"gemma2 correction: {GEMMA2_EOS_TOKEN!r} has id {tokenizer.eos_token_id} in {name_or_path}, "
            f"expected {GEMMA2_EOS_TOKEN_ID}; pass correct_gemma2=False for a tokenizer with another vocabulary"
        )
    if correct_pad_token:
        set_pad_token_id(tokenizer)
    return tokenizer


def hf_processor(name_or_path: str | os.PathLike, **kwargs) -> ProcessorMixin | None:
    """Load the multimodal processor of a model, or None for a text-only model.

    Processors that need torchvision for videos (the Qwen2-VL family) are built from their parts
    without it; see :mod:`rlvr.utils.processor`.

    Args:
        **kwargs: passed to the ``from_pretrained`` calls (e.g. ``trust_remote_code``).
    """
    resolved = resolve_model_path(name_or_path)
    if resolved.is_gguf or not Path(resolved.path_or_id).is_dir():
        # a GGUF file carries a tokenizer only; a hub id is resolved by AutoProcessor itself
        processor = None if resolved.is_gguf else _auto_processor(resolved.path_or_id, **kwargs)
    else:
        processor = load_processor(resolved.path_or_id, **kwargs)
    return processor if isinstance(processor, ProcessorMixin) else None


def _auto_processor(name: str, **kwargs) -> ProcessorMixin | None:
    try:
        return AutoProcessor.from_pretrained(name, **kwargs)
    except (OSError, ValueError, KeyError):
        # text-only models ship no processor config; AutoProcessor then has nothing to build
        return None


def set_chat_template(tokenizer: PreTrainedTokenizerBase, processor: ProcessorMixin | None, template: str | None
                      ) -> None:
    """Replace the chat template of the tokenizer (and of the processor, which renders rows with
    images) with ``template`` (``model.custom_chat_template``; None keeps theirs)."""
    if template is None:
        return
    tokenizer.chat_template = template
    if processor is not None:
        processor.chat_template = template


def data_tokenizer(model_config, data_config) -> tuple[PreTrainedTokenizerBase, ProcessorMixin | None]:
    """The tokenizer and processor (None for a text-only model) that tokenize the data in the
    driver: the policy's, with its custom chat template; custom code allowed by
    ``data.trust_remote_code`` (verl's key for them) or ``model.trust_remote_code``."""
    trust = bool(data_config.trust_remote_code or model_config.trust_remote_code)
    tokenizer = hf_tokenizer(model_config.tokenizer_path or model_config.path, trust_remote_code=trust)
    processor = hf_processor(model_config.path, trust_remote_code=trust)
    set_chat_template(tokenizer, processor, model_config.custom_chat_template)
    return tokenizer, processor
