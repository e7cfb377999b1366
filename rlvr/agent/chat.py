"""The tokens a chat template puts between turns, computed without re-tokenising what the model wrote.

After a model turn the agent loop appends the next messages (tool results, environment feedback)
and the opening of the next assistant turn. Their ids come from the chat template itself: the
template renders a short conversation whose assistant message is a marker, and everything after
the marker is what follows an assistant turn - the end of the turn, the new messages and the next
generation prompt, separators included. For SmolLM2's ChatML template, after a turn that the model
ended with ``<|im_end|>``, that is ``"\\n<|im_start|>tool\\n56088<|im_end|>\\n<|im_start|>assistant\\n"``
(the ``"\\n"`` after ``<|im_end|>`` is the separator a naive loop loses).

If the model ended its turn with an end-of-turn token (an EOS id), the template's copy of that
token is left out (the model's own token stays in the sequence); if it stopped at a stop string
(``</tool_call>``) the end of the turn is inserted. Only this inserted text is tokenised; the
model's sampled ids are never decoded and encoded again to build a training sequence. Messages
with images (an environment's observation) are rendered by the processor's chat template and
expanded by the processor, which also returns the images' tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase, ProcessorMixin

from rlvr.utils.multimodal import image_messages, processor_image_inputs

__all__ = ["ChatTurns", "render_prompt_ids"]

_MARKER = "RLVR_TURN_MARKER_7f3a"


def render_prompt_ids(tokenizer: PreTrainedTokenizerBase, messages: Sequence[dict[str, Any]]) -> list[int]:
    """Ids of a prompt rendered with the chat template and the generation prompt (as the dataset does)."""
    text = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


class ChatTurns:
    """Ids of the messages inserted after a model turn (see the module docstring).

    Args:
        tokenizer: the policy's tokenizer with its chat template.
        eos_ids: the ids that end a model turn (the tokenizer's EOS ids).

    Raises:
        ValueError: the tokenizer has no chat template, or the template does not render an
            assistant message's content verbatim (then turns cannot be joined exactly).
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, eos_ids: Sequence[int],
                 processor: ProcessorMixin | None = None) -> None:
        if not tokenizer.chat_template:
            raise ValueError("multi-turn rollouts need a tokenizer with a chat template (tokenizer.chat_template "
                             "is empty); set one or use the single_turn agent loop")
        self.tokenizer = tokenizer
        self.processor = processor
        self.end_texts = {int(i): tokenizer.decode([int(i)], skip_special_tokens=False) for i in eos_ids}
        self.after_turn([{"role": "user", "content": "probe"}], last_token=None)  # fails early on odd templates

    def _text_after_turn(self, messages: Sequence[dict[str, Any]], template: Any) -> str:
        conversation = [{"role": "user", "content": "question"}, {"role": "assistant", "content": _MARKER},
                        *messages]
        text = template.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
        if text.count(_MARKER) != 1:
            raise ValueError("the chat template does not render an assistant message's content verbatim, so the "
                             "tokens between turns cannot be taken from it; use a template that does")
        return text[text.index(_MARKER) + len(_MARKER):]

    def _inserted_text(self, messages: Sequence[dict[str, Any]], last_token: int | None, template: Any) -> str:
        text = self._text_after_turn(messages, template)
        end = self.end_texts.get(int(last_token)) if last_token is not None else None
        return text[len(end):] if end and text.startswith(end) else text

    def after_turn(self, messages: Sequence[dict[str, Any]], last_token: int | None) -> list[int]:
        """Ids to append after a model turn: the end of the turn (unless the model's ``last_token``
        already ended it), ``messages`` and the next assistant turn's opening.

        Args:
            messages: chat messages, e.g. ``[{"role": "tool", "content": "56088"}]``.
            last_token: the turn's last sampled id.
        """
        text = self._inserted_text(messages, last_token, self.tokenizer)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def after_turn_with_images(self, messages: Sequence[dict[str, Any]], images: Sequence[Any],
                               last_token: int | None) -> tuple[list[int], dict[str, torch.Tensor]]:
        """:meth:`after_turn` for messages with images: each ``<image>`` in their contents becomes the
        image's run of image tokens (rendered by the processor's chat template, expanded by the processor).

        Args:
            images: the images (``PIL.Image``), one per ``<image>``, in order.

        Returns:
            ``(ids, image inputs)``: the image inputs are the processor's tensors of ``images``
            (``pixel_values``, ...; see :mod:`rlvr.utils.multimodal`).

        Raises:
            ValueError: the model has no processor (a text-only model cannot see images).
        """
        if self.processor is None:
            raise ValueError("an inserted message holds images, but the model has no multimodal processor "
                             "(a text-only model cannot read images); use a vision-language model")
        text = self._inserted_text(image_messages(messages), last_token, self.processor)
        features = self.processor(text=[text], images=list(images), return_tensors="pt")
        return features["input_ids"][0].tolist(), processor_image_inputs(features)
