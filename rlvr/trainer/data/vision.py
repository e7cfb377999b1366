"""Prompts with images: the multimodal processor's side of the RL dataset.

A row in verl's format writes an ``<image>`` placeholder into its prompt messages where an image
goes and lists the images, in order, in its ``images`` column (``data.image_key``)::

    {"prompt": [{"role": "user", "content": "<image>What colour is the shape?"}],
     "images": ["shapes/0001.png"], ...}

Each message's content is split at the placeholders into the typed parts chat templates of vision
models expect (``[{"type": "image"}, {"type": "text", "text": "What colour is the shape?"}]``),
rendered with the processor's chat template (:func:`~rlvr.utils.multimodal.image_messages`), and
run through the processor with the images (read by :mod:`rlvr.utils.images`): the
processor puts as many image tokens as the vision encoder makes features where each image goes
and returns the image tensors (``pixel_values``, ``image_grid_thw``), which become the row's
``multi_modal_inputs``; the decoded images are its ``multi_modal_data`` (``{"image": [...]}``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import ProcessorMixin

from rlvr.utils.errors import DataError
from rlvr.utils.images import ImageReadError, row_images
from rlvr.utils.multimodal import (
    IMAGE_PLACEHOLDER, MULTI_MODAL_DATA, MULTI_MODAL_INPUTS, image_messages, processor_image_inputs,
)

__all__ = ["ImagePrompts"]


class ImagePrompts:
    """Turns rows with images into token ids and image inputs through the processor.

    Args:
        processor: the model's multimodal processor (see :mod:`rlvr.utils.processor`).
        image_key: the column holding a row's images (``data.image_key``).
        apply_chat_template: render with the processor's chat template (else the message contents
            are joined with newlines and each placeholder becomes the processor's image token).
        processor_kwargs: more keyword arguments of the processor's call (``data.mm_processor_kwargs``,
            e.g. ``max_pixels``).
    """

    def __init__(self, processor: ProcessorMixin, image_key: str, apply_chat_template: bool,
                 processor_kwargs: dict[str, Any] | None = None) -> None:
        self.processor = processor
        self.image_key = image_key
        self.apply_chat_template = apply_chat_template
        self.processor_kwargs = dict(processor_kwargs or {})
        self.image_token_id = int(processor.image_token_id)

    def has_images(self, row: dict[str, Any]) -> bool:
        entries = row.get(self.image_key)
        return entries is not None and (not isinstance(entries, (list, tuple)) or len(entries) > 0)

    def _text(self, prompt: Any) -> str:
        if self.apply_chat_template:
            return self.processor.apply_chat_template(image_messages(list(prompt)), add_generation_prompt=True,
                                                      tokenize=False)
        text = prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt)
        return text.replace(IMAGE_PLACEHOLDER, self.processor.image_token)

    def encode(self, row: dict[str, Any], prompt_key: str, base_dir: Path, where: str
               ) -> tuple[list[int], dict[str, torch.Tensor], list[Any]]:
        """``(prompt ids, multi_modal_inputs, images)`` of one row.

        Raises:
            DataError: an image cannot be read, or the number of ``<image>`` placeholders differs
                from the number of images (naming ``where``, the row, and the field).
        """
        try:
            images = row_images(row, self.image_key, base_dir)
        except ImageReadError as err:
            raise DataError(f"{where}: {err}") from None
        prompt = row[prompt_key]
        contents = [prompt] if isinstance(prompt, str) else [m["content"] for m in prompt]
        placeholders = sum(content.count(IMAGE_PLACEHOLDER) for content in contents)
        if placeholders != len(images):
            raise DataError(f"{where}: field {prompt_key!r} has {placeholders} {IMAGE_PLACEHOLDER} placeholder(s) "
                            f"but field {self.image_key!r} holds {len(images)} image(s); put one {IMAGE_PLACEHOLDER} "
                            "in the prompt where each image goes")
        features = self.processor(text=[self._text(prompt)], images=images, return_tensors="pt", **self.processor_kwargs)
        ids = features["input_ids"][0][features["attention_mask"][0].bool()].tolist()
        return ids, processor_image_inputs(features), images

    def image_tokens(self, ids: list[int]) -> int:
        return sum(1 for token in ids if token == self.image_token_id)

    def check_truncation(self, full: list[int], kept: list[int], where: str, limit: int) -> None:
        """A truncated prompt must keep every image token (the model needs one per image feature).

        Raises:
            DataError: truncation cut into an image.
        """
        if self.image_tokens(kept) != self.image_tokens(full):
            raise DataError(f"{where}: the prompt has {len(full)} tokens ({self.image_tokens(full)} of them image "
                            f"tokens) > data.max_prompt_length={limit}, and data.truncation would cut into an image; "
                            "raise data.max_prompt_length, set data.filter_overlong_prompts=True (drop such prompts), "
                            "or use smaller images (the image processor's max_pixels)")

    def item_fields(self, inputs: dict[str, torch.Tensor], images: list[Any]) -> dict[str, Any]:
        """The non-tensor fields of a dataset item."""
        return {MULTI_MODAL_INPUTS: inputs, MULTI_MODAL_DATA: {"image": images} if images else {}}
