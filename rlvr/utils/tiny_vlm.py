"""Tiny Qwen2-VL and Qwen2.5-VL models made on this machine, for tests.

No vision-language model can be downloaded here, so the tests build the real transformers
architectures from a config with random weights, as TRL's and verl's tests do:

- text: 2 layers, hidden size 64, 4 attention heads / 2 KV heads, M-RoPE sections ``[2, 3, 3]``;
- vision: depth 2, width 32 (patch 14, 2x2 merge), projecting to the text width;
- tokenizer: SmolLM2's (the embedded default model's) with the five Qwen vision special tokens
  added (vocabulary 49157) and a ChatML template that renders image parts as
  ``<|vision_start|><|image_pad|><|vision_end|>``;
- image processor: Qwen2-VL's with ``min_pixels`` 3136 and ``max_pixels`` 12544, so a 56x56 image
  gives 16 patches and 4 image tokens.

The processor is built from its parts (:mod:`rlvr.utils.processor`, no torchvision).
"""

from __future__ import annotations

import os

import torch
from transformers import (
    AutoTokenizer,
    PreTrainedModel,
    ProcessorMixin,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2_5_VLProcessor,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen2VLProcessor,
)
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from rlvr.utils.model import DEFAULT_MODEL, local_model_dir
from rlvr.utils.processor import image_only_processor_class, save_processor

__all__ = ["QWEN_VISION_TOKENS", "QWEN_VL_CHAT_TEMPLATE", "TINY_VL_TYPES", "tiny_vl_processor", "tiny_qwen_vl",
           "save_tiny_qwen_vl"]

QWEN_VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>", "<|vision_pad|>"]

QWEN_VL_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""ChatML (SmolLM2's turns, no default system message) with Qwen's image markers."""

TINY_VL_TYPES = {
    "qwen2_vl": (Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLProcessor),
    "qwen2_5_vl": (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLProcessor),
}
"""``model_type`` -> (config class, model class, processor class)."""

_MIN_PIXELS, _MAX_PIXELS = 56 * 56, 112 * 112


def tiny_vl_processor(model_type: str = "qwen2_5_vl") -> ProcessorMixin:
    """The tiny models' processor (see the module docstring)."""
    processor_cls = TINY_VL_TYPES[model_type][2]
    tokenizer = AutoTokenizer.from_pretrained(local_model_dir(DEFAULT_MODEL))
    tokenizer.add_special_tokens({"additional_special_tokens": QWEN_VISION_TOKENS})
    tokenizer.chat_template = QWEN_VL_CHAT_TEMPLATE
    image_processor = Qwen2VLImageProcessorPil(min_pixels=_MIN_PIXELS, max_pixels=_MAX_PIXELS)
    return image_only_processor_class(processor_cls)(image_processor=image_processor, tokenizer=tokenizer,
                                                     chat_template=QWEN_VL_CHAT_TEMPLATE)


def _vision_config(model_type: str) -> dict:
    common = {"depth": 2, "num_heads": 2, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
              "in_channels": 3}
    if model_type == "qwen2_vl":  # embed_dim is the width, hidden_size the merger's output (the text width)
        return {**common, "embed_dim": 32, "mlp_ratio": 2, "hidden_size": 64}
    return {**common, "hidden_size": 32, "intermediate_size": 64, "out_hidden_size": 64, "window_size": 56,
            "fullatt_block_indexes": [1]}


def tiny_qwen_vl(model_type: str = "qwen2_5_vl", seed: int = 0) -> PreTrainedModel:
    """A randomly initialised tiny Qwen2-VL (``"qwen2_vl"``) or Qwen2.5-VL (``"qwen2_5_vl"``) in fp32,
    its vocabulary the one of :func:`tiny_vl_processor`."""
    config_cls, model_cls, _ = TINY_VL_TYPES[model_type]
    processor = tiny_vl_processor(model_type)
    tokenizer = processor.tokenizer
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in QWEN_VISION_TOKENS}
    text = {"vocab_size": len(tokenizer), "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 1024,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
            "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id}
    config = config_cls(text_config=text, vision_config=_vision_config(model_type),
                        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
                        tie_word_embeddings=True)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return model_cls(config).eval()


def save_tiny_qwen_vl(path: str | os.PathLike, model_type: str = "qwen2_5_vl", seed: int = 0) -> str:
    """Write a tiny model, its processor and tokenizer as a Hugging Face folder; returns the path."""
    tiny_qwen_vl(model_type, seed).save_pretrained(path)
    save_processor(tiny_vl_processor(model_type), path)
    return os.fspath(path)
