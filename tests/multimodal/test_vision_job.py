"""The vision job's parts: drawn-shape data, the one-word scorer, the LLaVA processor, the caption
batches and warm start (on a tiny LLaVA model), and the assembled SmolLM2 VLM (slow)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import LlamaConfig, LlavaConfig, LlavaForConditionalGeneration, SiglipVisionConfig

from rlvr.data_prep import vision_warm_start
from rlvr.data_prep.vision_model import (IMAGE_TOKEN, build_vision_model, save_vision_model,
                                         vision_processor)
from rlvr.data_prep.vision_shapes import COLOURS, IMAGE_SIZE, SHAPES, draw_shape, write_dataset
from rlvr.data_prep.vision_warm_start import caption_batch, evaluate, rescore, warm_start
from rlvr.reward.scorers import default_compute_score
from rlvr.trainer.data import read_rows
from rlvr.utils.model import load_causal_lm


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    root = tmp_path_factory.mktemp("shapes")
    write_dataset(root, train=12, test=6, warm=16, seed=0)
    return root


def test_the_data_is_seeded_and_the_held_out_images_are_new(shapes, tmp_path):
    write_dataset(tmp_path, train=12, test=6, warm=16, seed=0)
    for name in ("train.jsonl", "test.jsonl", "warm.jsonl"):
        assert (tmp_path / name).read_text() == (shapes / name).read_text()
    train, test = read_rows(shapes / "train.jsonl"), read_rows(shapes / "test.jsonl")
    train_pixels = {np.asarray(Image.open(shapes / r["images"][0])).tobytes() for r in train}
    assert not any(np.asarray(Image.open(shapes / r["images"][0])).tobytes() in train_pixels for r in test)
    row = test[1]
    assert row["prompt"] == [{"role": "user", "content": "What shape is a stop sign? Answer with one word."},
                             {"role": "assistant", "content": "Octagon"},
                             {"role": "user", "content": "<image>What shape is it? Answer with one word."}]
    assert row["reward_model"]["ground_truth"] == row["extra_info"]["shape"] and row["data_source"] == "vision_shapes"
    assert test[0]["reward_model"]["ground_truth"] == test[0]["extra_info"]["colour"]
    warm = read_rows(shapes / "warm.jsonl")[0]
    assert warm["answer"] == f"A {warm['extra_info']['colour']} {warm['extra_info']['shape']}."


def test_a_drawn_shape_has_its_colour():
    import random

    for colour in COLOURS:
        image = np.asarray(draw_shape(random.Random(3), colour, SHAPES[1])).reshape(-1, 3)
        assert image.shape == (IMAGE_SIZE * IMAGE_SIZE, 3)
        assert (np.abs(image.astype(int) - COLOURS[colour]).sum(-1) < 10).mean() > 0.15  # the filled square


@pytest.mark.parametrize("response, truth, expected", [
    ("red", "red", (1.0, 1.0, 1.0)), (" Red.", "red", (1.0, 1.0, 1.0)), ("The shape is red.", "red", (0.25, 0.0, 1.0)),
    ("red or blue", "red", (0.0, 0.0, 0.0)), ("blue", "red", (0.0, 0.0, 0.0)), ("Circles!", "circle", (0.5, 0.0, 1.0)),
    ("circle", "circle", (1.0, 1.0, 1.0)), ("a red circle", "circle", (1 / 3, 0.0, 1.0)),
    ("A purple", "purple", (0.5, 0.0, 1.0)), ("A purple square. You can think of", "purple", (1 / 7, 0.0, 1.0)),
    ("A blue square.", "purple", (0.0, 0.0, 0.0)),
])
def test_the_scorer_wants_the_word(response, truth, expected):
    result = default_compute_score("vision_shapes", response, truth)
    assert (result["score"], result["acc"], result["mentions"]) == expected


def test_the_processor_gives_16_image_tokens_and_the_chat_turns_of_smollm2():
    processor = vision_processor()
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\n<image>What?<|im_end|>\n<|im_start|>assistant\n"
    features = processor(text=[text], images=[Image.new("RGB", (48, 48))], return_tensors="pt")
    image_id = processor.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    assert image_id == 49152 and int((features["input_ids"] == image_id).sum()) == 16
    assert features["pixel_values"].shape == (1, 3, 48, 48)


def tiny_llava(processor) -> LlavaForConditionalGeneration:
    """A tiny random LLaVA with the vision job's vocabulary and image geometry."""
    text = LlamaConfig(vocab_size=len(processor.tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    vision = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                image_size=48, patch_size=12)
    config = LlavaConfig(vision_config=vision, text_config=text, vision_feature_select_strategy="full",
                         vision_feature_layer=-1, image_token_id=processor.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
                         image_seq_length=16, tie_word_embeddings=True)
    torch.manual_seed(0)
    return LlavaForConditionalGeneration(config).eval()


def test_caption_batches_label_only_the_caption(shapes):
    processor = vision_processor()
    rows = read_rows(shapes / "warm.jsonl")[:3]
    batch = caption_batch(processor, rows, shapes)
    tokenizer = processor.tokenizer
    for i, row in enumerate(rows):
        labelled = batch["labels"][i][batch["labels"][i] != -100].tolist()
        assert labelled == tokenizer(row["answer"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        real = batch["input_ids"][i][batch["attention_mask"][i].bool()].tolist()
        assert real[-len(labelled):] == labelled and batch["attention_mask"][i, -1] == 1  # left-padded
    assert batch["pixel_values"].shape == (3, 3, 48, 48)


def test_the_warm_start_trains_only_the_vision_side_and_evaluation_scores_every_question(shapes):
    processor = vision_processor()
    model = tiny_llava(processor)
    language = {k: v.clone() for k, v in model.model.language_model.state_dict().items()}
    vision = {k: v.clone() for k, v in model.model.vision_tower.state_dict().items()}
    losses = warm_start(model, processor, shapes / "warm.jsonl", steps=6, batch_size=4, lr=1e-2, seed=0, log_every=3)
    assert len(losses) == 6 and losses[-1] < losses[0]
    assert all(torch.equal(v, model.model.language_model.state_dict()[k]) for k, v in language.items())
    assert any(not torch.equal(v, model.model.vision_tower.state_dict()[k]) for k, v in vision.items())
    assert all(p.requires_grad for p in model.parameters()) and not model.training
    result = evaluate(model, processor, shapes / "test.jsonl", max_new_tokens=3)
    assert len(result["samples"]) == 6 and set(result) >= {"acc", "mentions", "acc/colour", "acc/shape"}
    sample = result["samples"][0]
    assert sample["image"] == "images_test/test_00000.png" and sample["truth"] == read_rows(shapes / "test.jsonl")[0][
        "reward_model"]["ground_truth"]


def test_rescore_evaluates_both_models_again_and_keeps_the_training_record(shapes, tmp_path, monkeypatch):
    processor = vision_processor()
    untrained, warm = tiny_llava(processor), tiny_llava(processor)
    with torch.no_grad():
        for p in warm.model.multi_modal_projector.parameters():
            p.add_(0.5)  # another model than the untrained draw
    save_vision_model(warm, processor, tmp_path / "model")
    (tmp_path / "warm_start.json").write_text(json.dumps({"losses": [3.0, 1.0], "warm_start_s": 12.0,
                                                          "before": {"acc": 0.5}, "after": {"acc": 0.5}}))
    monkeypatch.setattr(vision_warm_start, "build_vision_model", lambda seed: (untrained, processor))
    result = rescore(shapes / "test.jsonl", tmp_path, seed=1)
    stored = json.loads((tmp_path / "warm_start.json").read_text())
    assert stored == json.loads(json.dumps(result))
    assert stored["losses"] == [3.0, 1.0] and stored["warm_start_s"] == 12.0
    assert stored["before"] == json.loads(json.dumps(evaluate(untrained, processor, shapes / "test.jsonl")))
    assert stored["after"] == json.loads(json.dumps(evaluate(warm, processor, shapes / "test.jsonl")))
    assert len(stored["after"]["samples"]) == 6 and stored["rescored_on"] == str(shapes / "test.jsonl")
    with pytest.raises(SystemExit, match="warm_start.json is missing"):
        rescore(shapes / "test.jsonl", tmp_path / "elsewhere", seed=1)


@pytest.mark.slow
def test_the_assembled_model_is_smollm2_with_a_vision_encoder(tmp_path):
    model, processor = build_vision_model(seed=1)
    smol = load_causal_lm("smollm2-135m-instruct")
    ids = processor.tokenizer("The capital of France is", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        # the same weights; float32 sums in another order (transformers 5.24's Llava path) differ by up to 3e-5 on
        # logits of size 27, a relative 1e-6 (another model would be off by whole units)
        assert torch.allclose(model(input_ids=ids).logits[..., :49152], smol(input_ids=ids).logits, rtol=1e-5, atol=1e-4)
    assert model.lm_head.weight is model.model.language_model.embed_tokens.weight
    other, _ = build_vision_model(seed=2)
    assert not torch.equal(model.model.multi_modal_projector.linear_1.weight, other.model.multi_modal_projector.linear_1.weight)
    json.dumps(model.config.to_dict())  # serialisable: the folder saves and loads
