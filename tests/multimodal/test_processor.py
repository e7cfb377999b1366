"""Processors without torchvision (rlvr.utils.processor) and the tiny vision-language models."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from mm_helpers import picture
from transformers import AutoProcessor, Qwen2_5_VLProcessor, Qwen2VLProcessor
from transformers.utils import is_torchvision_available

from rlvr.utils.model import load_causal_lm
from rlvr.utils.processor import ImageOnlyProcessor, image_only_processor_class, load_processor
from rlvr.utils.testing import save_tiny_model
from rlvr.utils.tiny_vlm import tiny_vl_processor
from rlvr.utils.tokenizer import hf_processor, hf_tokenizer


def test_torchvision_is_absent_and_autoprocessor_fails_for_qwen_vl(vl_dirs, tmp_path):
    """Why the workaround exists (transformers 5.24 without torchvision): a folder with the video
    processor's config, as real Qwen2.5-VL checkpoints have, does not load through AutoProcessor; it
    does through hf_processor. If AutoProcessor starts to work, the image-only class can go."""
    assert not is_torchvision_available()
    folder = shutil.copytree(vl_dirs["qwen2_5_vl"], tmp_path / "checkpoint")
    (folder / "video_preprocessor_config.json").write_text(json.dumps(
        {"video_processor_type": "Qwen2VLVideoProcessor", "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2}))
    with pytest.raises(ImportError, match="Qwen2VLVideoProcessor requires the Torchvision library"):
        AutoProcessor.from_pretrained(folder)
    assert type(hf_processor(folder)).__name__ == "Qwen2_5_VLProcessorWithoutVideo"


@pytest.mark.parametrize("kind, cls", [("qwen2_vl", Qwen2VLProcessor), ("qwen2_5_vl", Qwen2_5_VLProcessor)])
def test_the_image_only_processor_is_the_model_class_without_video(kind, cls, vl_dirs):
    made = image_only_processor_class(cls)
    assert issubclass(made, cls) and issubclass(made, ImageOnlyProcessor)
    assert made.get_attributes() == ["image_processor", "tokenizer"]
    assert image_only_processor_class(cls) is made  # one class per processor class
    loaded = hf_processor(vl_dirs[kind])
    assert type(loaded) is made and not hasattr(loaded, "video_processor")
    saved = json.loads((Path(vl_dirs[kind]) / "processor_config.json").read_text())
    assert saved["processor_class"] == cls.__name__  # the folder reads like the model's own


def test_a_56_pixel_image_gives_4_image_tokens_and_the_loaded_processor_matches_the_built_one(vl_dirs):
    built, loaded = tiny_vl_processor("qwen2_5_vl"), hf_processor(vl_dirs["qwen2_5_vl"])
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]}]
    text = built.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == ("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What is it?<|im_end|>\n"
                    "<|im_start|>assistant\n")
    assert loaded.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == text
    image = picture((200, 10, 10))
    a = built(text=[text], images=[image], return_tensors="pt")
    b = loaded(text=[text], images=[image], return_tensors="pt")
    image_token = built.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert int((a["input_ids"] == image_token).sum()) == 4
    assert a["pixel_values"].shape == (16, 3 * 2 * 14 * 14) and a["image_grid_thw"].tolist() == [[1, 4, 4]]
    assert all(torch.equal(a[key], b[key]) for key in a)


def test_tokenizer_model_and_processor_agree(vl_dirs):
    tokenizer = hf_tokenizer(vl_dirs["qwen2_vl"])
    model = load_causal_lm(vl_dirs["qwen2_vl"])
    assert len(tokenizer) == 49157 == model.config.get_text_config().vocab_size
    assert model.config.image_token_id == tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert type(model).__name__ == "Qwen2VLForConditionalGeneration"


def test_text_only_models_have_no_processor(tmp_path):
    assert hf_processor(save_tiny_model(tmp_path / "tiny")) is None
    assert load_processor(save_tiny_model(tmp_path / "tiny2")) is None
    assert hf_processor("smollm2-135m-instruct") is None


def test_an_unknown_processor_class_is_named(tmp_path):
    folder = save_tiny_model(tmp_path / "tiny")
    (folder / "processor_config.json").write_text(json.dumps({"processor_class": "NoSuchProcessor"}))
    with pytest.raises(ValueError, match="NoSuchProcessor"):
        load_processor(folder)
