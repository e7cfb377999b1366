"""Multimodal processors without torchvision.

In transformers 5 the processors of the Qwen2-VL family (and others that handle video) take a
video processor, and every video processor needs torchvision. torchvision cannot be installed next
to the CPU build of torch this project uses (the only matching build is a CUDA one, which fails to
import and then breaks transformers' image processors too), so ``AutoProcessor.from_pretrained``
fails for those models, real checkpoints included.

The workaround builds the processor from its parts instead: the image processor with the PIL
backend (``AutoImageProcessor.from_pretrained(path, backend="pil")``), the tokenizer, the chat
template, and the model's own processor class with its ``video_processor`` argument removed
(:func:`image_only_processor_class`, a subclass; nothing inside transformers is changed). Such a
processor handles text and images exactly as the original; asking it for videos fails. Where
torchvision is importable, or the processor has no video part (LLaVA), ``AutoProcessor`` is used
as is.

The subclass relies on one detail of ``ProcessorMixin.__init__`` (transformers 5.24): it pairs the
positional sub-processors with the attributes named in the subclass's ``__init__`` signature, so the
video processor the parent class passes on (None) is dropped. ``tests/utils/test_processor.py``
checks this against the pinned version.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

import transformers
from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer, ProcessorMixin
from transformers.utils import is_torchvision_available

from rlvr.utils.files import write_text_atomic

__all__ = ["ImageOnlyProcessor", "image_only_processor_class", "processor_class_name", "load_processor", "save_processor"]

_CONFIG_FILES = ("processor_config.json", "preprocessor_config.json", "tokenizer_config.json")


class ImageOnlyProcessor:
    """Marks a processor class made by :func:`image_only_processor_class`."""

    base_processor_class: str
    """Name of the transformers processor class it was made from."""


@functools.cache
def image_only_processor_class(cls: type[ProcessorMixin]) -> type[ProcessorMixin]:
    """``cls`` without its video processor: a subclass whose ``__init__`` takes the image processor,
    the tokenizer and the chat template (and ``cls``'s other keyword arguments)."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs) -> None:
        cls.__init__(self, image_processor, tokenizer, None, chat_template=chat_template, **kwargs)

    return type(f"{cls.__name__}WithoutVideo", (ImageOnlyProcessor, cls),
                {"__init__": __init__, "__doc__": cls.__doc__, "base_processor_class": cls.__name__})


def processor_class_name(model_dir: str | os.PathLike) -> str | None:
    """The ``processor_class`` a model folder declares (processor, preprocessor or tokenizer
    config), or None for a text-only model."""
    for name in _CONFIG_FILES:
        path = Path(model_dir) / name
        if path.is_file():
            declared = json.loads(path.read_text(encoding="utf-8")).get("processor_class")
            if declared:
                return str(declared)
    return None


def _chat_template(model_dir: Path, tokenizer: Any) -> str | None:
    """The processor's chat template saved in the folder, else the tokenizer's."""
    if (model_dir / "chat_template.jinja").is_file():
        return (model_dir / "chat_template.jinja").read_text(encoding="utf-8")
    if (model_dir / "chat_template.json").is_file():
        return json.loads((model_dir / "chat_template.json").read_text(encoding="utf-8"))["chat_template"]
    return tokenizer.chat_template


def _processor_kwargs(model_dir: Path, cls: type[ProcessorMixin]) -> dict[str, Any]:
    """The processor's own settings in ``processor_config.json`` (not its sub-processors')."""
    path = model_dir / "processor_config.json"
    if not path.is_file():
        return {}
    settings = json.loads(path.read_text(encoding="utf-8"))
    skipped = {*cls.get_attributes(), "processor_class", "auto_map"}
    return {key: value for key, value in settings.items() if key not in skipped}


def load_processor(model_dir: str | os.PathLike, **kwargs) -> ProcessorMixin | None:
    """The multimodal processor of a local model folder, or None for a text-only model.

    Args:
        model_dir: a Hugging Face model folder.
        **kwargs: passed to the ``from_pretrained`` calls (e.g. ``trust_remote_code``).

    Raises:
        ValueError: the folder names a processor class transformers does not have.
    """
    name = processor_class_name(model_dir)
    if name is None:
        return None
    cls = getattr(transformers, name, None)
    if cls is None:
        raise ValueError(f"{model_dir} declares processor_class={name!r}, which transformers "
                         f"{transformers.__version__} does not have")
    if "video_processor" not in cls.get_attributes() or is_torchvision_available():
        return AutoProcessor.from_pretrained(model_dir, **kwargs)
    folder = Path(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
    image_processor = AutoImageProcessor.from_pretrained(folder, backend="pil", **kwargs)
    return image_only_processor_class(cls)(image_processor=image_processor, tokenizer=tokenizer,
                                           chat_template=_chat_template(folder, tokenizer),
                                           **_processor_kwargs(folder, cls))


def save_processor(processor: ProcessorMixin, model_dir: str | os.PathLike) -> None:
    """``processor.save_pretrained(model_dir)``, naming the original class for an image-only one, so
    the folder reads like the model's own (and loads with ``AutoProcessor`` where torchvision is)."""
    processor.save_pretrained(model_dir)
    if not isinstance(processor, ImageOnlyProcessor):
        return
    original = processor.base_processor_class
    for name in _CONFIG_FILES:
        path = Path(model_dir) / name
        if path.is_file():
            settings = json.loads(path.read_text(encoding="utf-8"))
            if "processor_class" in settings:
                settings["processor_class"] = original
                write_text_atomic(path, json.dumps(settings, indent=2, sort_keys=True) + "\n")
