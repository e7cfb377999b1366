"""The vision job's model: the embedded SmolLM2-135M-Instruct with a small vision encoder, LLaVA-style.

No pretrained vision-language model can be installed here, so one is assembled from transformers'
LLaVA architecture (Liu et al. 2023, "Visual Instruction Tuning", arXiv:2304.08485):

- language model: SmolLM2-135M-Instruct (a Llama model; its weights, tokenizer and chat turns),
  with one token added, ``<image>``;
- vision encoder: a SigLIP vision transformer (Zhai et al. 2023, arXiv:2303.15343) with random
  weights: 48x48 images in 12x12 patches (16 patches), width 128, 2 layers;
- projector: LLaVA's two-layer MLP from the encoder's width to the language model's (576), random.

Each image becomes 16 image tokens. The processor is transformers' ``LlavaProcessor`` (SigLIP's image
processor with the PIL backend, no torchvision) with a ChatML template like SmolLM2's that writes an
image part as ``<image>`` and adds no default system message (shorter prompts on CPU). The encoder
and projector know nothing yet; :mod:`rlvr.data_prep.vision_warm_start` teaches them to see.
"""

from __future__ import annotations

import os

import torch
from transformers import (
    AutoConfig,
    AutoTokenizer,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaProcessor,
    SiglipVisionConfig,
)
from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

from rlvr.data_prep.vision_shapes import IMAGE_SIZE
from rlvr.utils.model import DEFAULT_MODEL, load_causal_lm, local_model_dir

__all__ = ["IMAGE_TOKEN", "PATCH_SIZE", "VISION_CHAT_TEMPLATE", "vision_processor", "build_vision_model",
           "save_vision_model"]

IMAGE_TOKEN = "<image>"
PATCH_SIZE = 12
VISION_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<image>' }}{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def vision_processor() -> LlavaProcessor:
    """SmolLM2's tokenizer with ``<image>`` added and SigLIP's image processor at 48x48."""
    tokenizer = AutoTokenizer.from_pretrained(local_model_dir(DEFAULT_MODEL))
    tokenizer.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    tokenizer.chat_template = VISION_CHAT_TEMPLATE
    image_processor = SiglipImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    return LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=PATCH_SIZE,
                          vision_feature_select_strategy="full", chat_template=VISION_CHAT_TEMPLATE,
                          image_token=IMAGE_TOKEN)


def build_vision_model(seed: int) -> tuple[LlavaForConditionalGeneration, LlavaProcessor]:
    """The assembled model (fp32; the encoder and projector drawn with ``seed``) and its processor."""
    processor = vision_processor()
    tokenizer = processor.tokenizer
    text_dir = local_model_dir(DEFAULT_MODEL)
    text_config = AutoConfig.from_pretrained(text_dir)
    text_config.vocab_size = len(tokenizer)
    vision_config = SiglipVisionConfig(hidden_size=128, intermediate_size=512, num_hidden_layers=2,
                                       num_attention_heads=4, image_size=IMAGE_SIZE, patch_size=PATCH_SIZE)
    config = LlavaConfig(vision_config=vision_config, text_config=text_config,
                         image_token_id=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
                         vision_feature_select_strategy="full", vision_feature_layer=-1,
                         image_seq_length=(IMAGE_SIZE // PATCH_SIZE) ** 2,
                         tie_word_embeddings=text_config.tie_word_embeddings)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlavaForConditionalGeneration(config)
    language = load_causal_lm(DEFAULT_MODEL)
    embeddings = language.get_input_embeddings().weight.data
    with torch.no_grad():
        text_state = dict(language.model.state_dict())
        new_rows = model.get_input_embeddings().weight[embeddings.shape[0]:].clone()
        text_state["embed_tokens.weight"] = torch.cat([embeddings, new_rows])  # <image>: its features replace it
        model.model.language_model.load_state_dict(text_state)
    model.tie_weights()
    return model.eval(), processor


def save_vision_model(model: LlavaForConditionalGeneration, processor: LlavaProcessor, path: str | os.PathLike) -> str:
    """Write the model and its processor as a Hugging Face folder; returns the path."""
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return os.fspath(path)
