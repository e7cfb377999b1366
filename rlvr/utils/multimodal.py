"""Images in the batch: the processor's per-row outputs and the model inputs built from them.

A prompt with images becomes token ids (each image a run of image tokens, as many as the vision
encoder makes features) and the image inputs of the row. As in verl, the batch carries them per
row in two non-tensor columns:

- ``multi_modal_inputs``: a dict of tensors per row, what the processor returned besides the ids:
  ``pixel_values`` (Qwen2-VL family: ``[patches, C*T*P*P]``; LLaVA-style: ``[images, C, H, W]``)
  and ``image_grid_thw`` ``[images, 3]`` (Qwen2-VL family). ``{}`` for a row without images.
- ``multi_modal_data``: ``{"image": [PIL.Image, ...]}`` per row, the decoded images (what an engine
  with its own image processing, such as vLLM, takes).

The tensors of a row concatenate along dim 0 with those of the next row, so a micro-batch's model
inputs are the rows' tensors joined in row order (:meth:`MultiModalRows.merged`): the model fills
its image tokens with the features in that order.

Rotary positions of the Qwen2-VL family (M-RoPE, Wang et al. 2024, "Qwen2-VL", arXiv:2409.12191)
are 3-D: image tokens get (temporal, height, width) positions and the text after an image goes on
from the largest of them. transformers computes them only when it receives ``mm_token_type_ids``;
given 2-D ``position_ids`` it silently uses 1-D positions. The batch therefore keeps the usual
1-D ``position_ids [B, T]`` and :func:`model_inputs` replaces them by the model's own
``get_rope_index`` whenever a micro-batch holds images (without images both are equal).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from rlvr.utils.model import is_vision_language_model

__all__ = [
    "IMAGE_PLACEHOLDER",
    "MULTI_MODAL_INPUTS",
    "MULTI_MODAL_DATA",
    "image_messages",
    "processor_image_inputs",
    "MROPE_MODEL_TYPES",
    "MultiModalRows",
    "multi_modal_rows",
    "multi_modal_batch",
    "uses_mrope",
    "rope_index",
    "model_inputs",
    "position_offsets",
    "with_multi_modal_rows",
    "image_row_keys",
    "check_images_on_every_rank",
]

IMAGE_PLACEHOLDER = "<image>"
"""Where an image goes in a prompt message's content (verl's placeholder)."""

MULTI_MODAL_INPUTS = "multi_modal_inputs"
"""Non-tensor column: the processor's image tensors of each row (a dict; ``{}`` without images)."""
MULTI_MODAL_DATA = "multi_modal_data"
"""Non-tensor column: the decoded images of each row, ``{"image": [PIL.Image, ...]}``."""

MROPE_MODEL_TYPES = frozenset({"qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe"})
"""``config.model_type`` of the models with 3-D rotary positions computed by ``get_rope_index``."""

_IMAGE, _VIDEO = 1, 2  # mm_token_type_ids of transformers: text 0, image 1, video 2
_TOKEN_KEYS = ("input_ids", "attention_mask", "mm_token_type_ids")  # rebuilt from the ids, not image inputs
_VIDEO_KEYS = ("second_per_grid_ts",)  # video timing; images have none


def image_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages with each string content split at ``<image>`` into ``{"type": "image"}`` and
    ``{"type": "text", "text": ...}`` parts, the form the chat templates of vision models render."""
    out = []
    for message in messages:
        parts = [part for part in re.split(f"({re.escape(IMAGE_PLACEHOLDER)})", message["content"]) if part]
        content = [{"type": "image"} if part == IMAGE_PLACEHOLDER else {"type": "text", "text": part} for part in parts]
        out.append({**message, "content": content})
    return out


def processor_image_inputs(features: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The image tensors of a processor's output for one text (``pixel_values``, ``image_grid_thw``,
    ...): everything but the token ids, their mask and their modality types, which the model inputs
    are rebuilt from."""
    return {key: value for key, value in features.items() if key not in _TOKEN_KEYS + _VIDEO_KEYS}


class MultiModalRows:
    """A column of per-row image inputs that indexes and moves like the batch's tensors.

    The actor and critic cut their batch (a dict of ``[B, ...]`` tensors) into mini- and
    micro-batches with ``value[index]`` and move them with ``value.to(device)``; this column goes
    along with them.

    Args:
        rows: one dict of tensors per row (``{}`` for a row without images).
    """

    def __init__(self, rows: Sequence[dict[str, torch.Tensor]]) -> None:
        self.rows = [dict(row) if row else {} for row in rows]

    @property
    def shape(self) -> tuple[int]:
        return (len(self.rows),)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: Any) -> MultiModalRows:
        """Rows picked by a slice, a list, or an int tensor / array of indices."""
        if isinstance(index, slice):
            return MultiModalRows(self.rows[index])
        indices = index.tolist() if isinstance(index, (torch.Tensor, np.ndarray)) else list(index)
        return MultiModalRows([self.rows[int(i)] for i in indices])

    def to(self, device: str | torch.device) -> MultiModalRows:
        return MultiModalRows([{key: value.to(device) for key, value in row.items()} for row in self.rows])

    @property
    def has_images(self) -> bool:
        return any(self.rows)

    def merged(self) -> dict[str, torch.Tensor]:
        """The rows' tensors joined along dim 0 in row order (``{}`` when no row has images).

        Raises:
            ValueError: rows with images hold different keys (the processor output of one model
                always has the same keys).
        """
        present = [row for row in self.rows if row]
        if not present:
            return {}
        keys = sorted(present[0])
        for row in present[1:]:
            if sorted(row) != keys:
                raise ValueError(f"rows of one batch hold different image inputs: {keys} and {sorted(row)}")
        return {key: torch.cat([row[key] for row in present], dim=0) for key in keys}


def multi_modal_rows(non_tensor_batch: dict[str, np.ndarray]) -> MultiModalRows | None:
    """The ``multi_modal_inputs`` column of a batch as :class:`MultiModalRows`, or None when the batch
    has no such column or no row has images."""
    column = non_tensor_batch.get(MULTI_MODAL_INPUTS)
    if column is None:
        return None
    rows = MultiModalRows(list(column))
    return rows if rows.has_images else None


def with_multi_modal_rows(batch: dict[str, Any], non_tensor_batch: dict[str, np.ndarray]) -> dict[str, Any]:
    """``batch`` (a dict of ``[B, ...]`` tensors) with the rows' image inputs added under
    ``multi_modal_inputs`` when the batch has images (unchanged otherwise)."""
    rows = multi_modal_rows(non_tensor_batch)
    return batch if rows is None else {**batch, MULTI_MODAL_INPUTS: rows}


def uses_mrope(model: nn.Module) -> bool:
    """Whether the (unwrapped) transformers model takes 3-D rotary positions (:data:`MROPE_MODEL_TYPES`)."""
    return model.config.model_type in MROPE_MODEL_TYPES


def rope_index(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
               vision: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """3-D rotary positions from the model's own ``get_rope_index``.

    Args:
        model: the unwrapped transformers model (Qwen2-VL family); ``model.base_model`` holds
            ``get_rope_index``.
        input_ids, attention_mask: ``[b, L]`` (left or right padding; padding is skipped).
        vision: the merged image inputs of the ``b`` rows (``image_grid_thw`` ``[images, 3]``,
            ``video_grid_thw`` if any).

    Returns:
        ``(position_ids [3, b, L], deltas [b, 1])``: ``deltas`` is what the text after the last
        image adds to the 1-D position (the text token at 1-D position ``p`` gets ``p + delta``
        in all three components).
    """
    config = model.config
    _check_image_tokens(config, input_ids, vision.get("image_grid_thw"))
    token_types = ((input_ids == config.image_token_id).long() * _IMAGE
                   + (input_ids == config.video_token_id).long() * _VIDEO)
    return model.base_model.get_rope_index(
        input_ids=input_ids, mm_token_type_ids=token_types, image_grid_thw=vision.get("image_grid_thw"),
        video_grid_thw=vision.get("video_grid_thw"), attention_mask=attention_mask,
    )


def _check_image_tokens(config: Any, input_ids: torch.Tensor, image_grid_thw: torch.Tensor | None) -> None:
    """The image tokens of the rows must be as many as their images make features.

    Raises:
        ValueError: they are not (image inputs that do not belong to the rows' tokens, or an image
            token the model sampled in a response).
    """
    found = int((input_ids == config.image_token_id).sum())
    merge = config.vision_config.spatial_merge_size
    made = 0 if image_grid_thw is None else int(image_grid_thw.prod(-1).sum()) // merge**2
    if found != made:
        raise ValueError(f"the rows hold {found} image tokens but their images make {made} image features: "
                         "the rows' multi_modal_inputs do not belong to their token ids (or a response holds an "
                         "image token)")


def model_inputs(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 position_ids: torch.Tensor, multi_modal: MultiModalRows | None = None) -> dict[str, torch.Tensor]:
    """Keyword arguments of a forward pass over ``[b, L]`` token rows and their images.

    Args:
        model: the unwrapped transformers model (read for its config and ``get_rope_index``); the
            caller runs the wrapped module (peft, FSDP) with the result.
        input_ids, attention_mask, position_ids: ``[b, L]`` (1-D positions).
        multi_modal: the rows' image inputs (None or no images: a text-only forward).

    Returns:
        ``input_ids``, ``attention_mask``, ``position_ids`` (``[3, b, L]`` for an M-RoPE model with
        images, else the given ``[b, L]``) and the merged image inputs (``pixel_values``,
        ``image_grid_thw``, ...).
    """
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}
    vision = multi_modal.merged() if multi_modal is not None else {}
    if not vision:
        return inputs
    if uses_mrope(model):
        inputs["position_ids"] = rope_index(model, input_ids, attention_mask, vision)[0]
    return {**inputs, **vision}


def position_offsets(inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """``[b]``: what text tokens after these inputs add to their 1-D positions (the M-RoPE delta of
    each row: its largest 3-D position + 1 - its number of tokens; 0 with 1-D positions).

    Args:
        inputs: a prefill's :func:`model_inputs` (``position_ids`` ``[3, b, L]`` or ``[b, L]``).
    """
    positions, mask = inputs["position_ids"], inputs["attention_mask"].bool()
    if positions.dim() == 2:
        return torch.zeros(positions.shape[0], dtype=positions.dtype, device=positions.device)
    largest = positions.masked_fill(~mask.unsqueeze(0), -1).amax(dim=(0, 2))
    return largest + 1 - mask.sum(-1)


def image_row_keys(multi_modal: MultiModalRows) -> torch.Tensor:
    """``[b]`` int64: equal for rows with equal image inputs (0 for rows without images), so that
    rows with the same token ids but other images are never taken for the same prompt."""
    keys: dict[bytes, int] = {b"": 0}
    out = []
    for row in multi_modal.rows:
        digest = hashlib.sha1()
        for key in sorted(row):
            tensor = row[key].detach().cpu().contiguous()
            digest.update(f"{key}:{tensor.dtype}:{list(tensor.shape)}".encode())
            digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
        fingerprint = digest.digest() if row else b""
        out.append(keys.setdefault(fingerprint, len(keys)))
    return torch.tensor(out, dtype=torch.long)


def multi_modal_batch(batch: dict[str, Any], non_tensor_batch: dict[str, np.ndarray], model: nn.Module,
                      world_size: int, method: str, packed: bool = False) -> dict[str, Any]:
    """``batch`` with its rows' image inputs (:func:`with_multi_modal_rows`), checked for the worker.

    Args:
        batch: ``[B, ...]`` tensors of one rank.
        non_tensor_batch: the rows' non-tensor fields (``multi_modal_inputs`` when they have images).
        model: the worker's model: a transformers model (wrapped or not) or a value model over one
            (its ``config`` says which); other modules (Megatron's) have no images to check.
        world_size: ranks the model is sharded over.
        method: the worker method, for messages.
        packed: the worker runs packed forwards (``use_remove_padding``, sequence parallelism).

    Raises:
        ValueError: rows with images on a packed worker (the packed forward takes no image inputs),
            or a sharded vision-language model with a row without an image
            (:func:`check_images_on_every_rank`).
    """
    batch = with_multi_modal_rows(batch, non_tensor_batch)
    if packed and MULTI_MODAL_INPUTS in batch:
        raise ValueError(f"{method}: the batch has images, but this worker packs its sequences "
                         "(model.use_remove_padding=true or ulysses_sequence_parallel_size > 1) and the packed "
                         "forward takes no image inputs; set use_remove_padding=false and "
                         "ulysses_sequence_parallel_size=1 for a vision-language run")
    check_images_on_every_rank(model, batch, world_size, method)
    return batch


def check_images_on_every_rank(model: nn.Module, batch: dict[str, Any], world_size: int, method: str) -> None:
    """A vision-language model sharded over several ranks needs an image in every row.

    FSDP2 gathers a sharded module's weights with a collective in every forward pass, so all ranks
    must run the vision encoder together: a rank whose micro-batch has no image would skip it and
    leave the others waiting (and its gradients would miss the encoder's). Datasets of image
    questions (verl's geo3k) have an image in every row.

    Raises:
        ValueError: a row of this rank's batch has no image (naming ``method`` and the count).
    """
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if world_size == 1 or model_type is None or not is_vision_language_model(model_type):
        return
    rows = batch.get(MULTI_MODAL_INPUTS)
    missing = len(batch["input_ids"]) if rows is None else sum(1 for row in rows.rows if not row)
    if missing:
        raise ValueError(f"{method}: {missing} row(s) of this rank's batch have no image, but the vision-language "
                         f"model is sharded over {world_size} ranks, which must run its vision encoder together in "
                         "every forward pass; give every row an image, or train text-only rows on one rank")
