"""Shared helpers of the multimodal tests: image data in verl's format, run configs and batches for the
tiny Qwen2-VL / Qwen2.5-VL models, and an independent reference forward."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from PIL import Image, ImageDraw

from tests.workers.model_worker_utils import make_config as worker_config

from rlvr.protocol import DataProto
from rlvr.trainer.data import RLHFDataset, collate_fn
from rlvr.utils.multimodal import MULTI_MODAL_INPUTS
from rlvr.utils.tokenizer import hf_processor, hf_tokenizer

QUESTION = "<image>What colour is this?"
COLOURS = [(220, 30, 30), (30, 180, 60), (40, 60, 220), (230, 200, 30)]


def picture(colour: tuple[int, int, int], size: tuple[int, int] = (56, 56), mark: int = 0) -> Image.Image:
    """A coloured image with a white square at a place chosen by ``mark`` (so images differ in layout too)."""
    image = Image.new("RGB", size, colour)
    x = 4 + 8 * (mark % 4)
    ImageDraw.Draw(image).rectangle((x, 8, x + 12, 20), fill=(255, 255, 255))
    return image


def write_image_rows(folder: Path, count: int = 4, wide_every: int = 2) -> Path:
    """``count`` rows (image files beside the JSONL, relative paths); every ``wide_every``-th image is
    84x56 (6 image tokens instead of 4), so rows differ in their number of image tokens."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(count):
        size = (84, 56) if i % wide_every == wide_every - 1 else (56, 56)
        picture(COLOURS[i % len(COLOURS)], size, mark=i).save(folder / f"img{i}.png")
        rows.append({"data_source": "colours", "prompt": [{"role": "user", "content": QUESTION}],
                     "images": [f"img{i}.png"], "reward_model": {"ground_truth": "red"}})
    path = folder / "data.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def make_config(model_path: str, *overrides: str):
    """The model-worker tests' run config for a tiny model (small batch sizes, one thread), with the
    actor always recomputing old log-probs (the image rows' log-probs are compared with it)."""
    return worker_config(model_path, "actor_rollout_ref.actor.use_rollout_log_probs=false", *overrides)


def image_batch(model_dir: str, data_file: Path, **meta) -> DataProto:
    """The prompts of ``data_file`` as the trainer batches them (dataset through the model's processor)."""
    dataset = RLHFDataset(str(data_file), hf_tokenizer(model_dir), make_config(model_dir).data,
                          processor=hf_processor(model_dir))
    return DataProto.from_single_dict(collate_fn([dataset[i] for i in range(len(dataset))]), meta_info=dict(meta))


def reference_log_probs(model, out: DataProto) -> torch.Tensor:
    """Log-probs ``[B, R]`` of the response tokens from a plain fp32 forward of each row alone (no
    padding), with the model computing its own 3-D positions from ``mm_token_type_ids`` as the
    processor returns them: independent of rlvr's model-input code. Compare where ``response_mask``
    is 1 (inserted tokens of a multi-turn response get a value too, but have no sampled log-prob)."""
    image_token = model.config.image_token_id
    responses = out.batch["responses"]
    result = torch.zeros(responses.shape)
    for i in range(len(out)):
        real = out.batch["attention_mask"][i].bool()
        ids = out.batch["input_ids"][i][real][None]
        vision = out.non_tensor_batch[MULTI_MODAL_INPUTS][i]
        with torch.no_grad():
            logits = model(input_ids=ids, mm_token_type_ids=(ids == image_token).long(), **vision).logits[0]
        n = int(real[-responses.shape[1]:].sum())  # response tokens: sampled and inserted
        log_probs = torch.log_softmax(logits[-n - 1 : -1].float(), dim=-1)
        result[i, :n] = log_probs.gather(-1, responses[i, :n, None])[:, 0]
    return result
